"""Acceptance checks of the built-in demo model. Run:

    python -m tpserve.train.acceptance [--model DIR] [--out DIR] [--gsm8k /work/shared/data/gsm8k/test.jsonl]

1. Greedy chat "Count from 1 to 200." (reasoning off and on) gives 1..200 in order.
2. 30 tool prompts with tools held out of training (new names and argument schemas): through
   the OpenAI server (in-process), the share of answers whose tool call our parser accepts, names
   a given tool and whose arguments validate against its JSON schema; streamed == non-streamed.
3. MTP acceptance at k=3, greedy, on structured prompts (counting, JSON, tool calls), with the
   plain torch drafting loop over the training forward (train/mtp_eval.py).
4. GSM8K 5-shot on the first 100 test questions (shots: the first 5 training questions).
Also `--only count_sweep`: check 1 for every target from 2 to 300 (reasoning off), not run by default.
Writes OUT/acceptance.json and OUT/acceptance.png.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import time
from pathlib import Path

from tqdm import tqdm

from tpserve.train import corpus

TOOL_PROMPTS = 30
TOOL_SEED = 20261201


def builtin_dir() -> Path:
    from tpserve.engine.setup import builtin_demo_model

    path = builtin_demo_model()
    if path is None:
        raise FileNotFoundError("the built-in demo model is not installed (src/tpserve/builtin/glm5-next-demo)")
    return path


# --------------------------------------------------------------------------- 1. counting
def _counting_model(model_dir: Path):
    from transformers import AutoTokenizer

    from tpserve.model.config import ModelConfig
    from tpserve.train.model import TrainModel, load_checkpoint_

    cfg = ModelConfig.from_file(model_dir)
    model = TrainModel(cfg, mtp=False)
    load_checkpoint_(model, model_dir)
    return model, AutoTokenizer.from_pretrained(str(model_dir)), cfg


def _count_case(model, tok, cfg, n: int, thinking: bool) -> dict:
    """Does greedy produce exactly "1, 2, ..., n" and then end its turn? Checked in one forward pass
    with the expected answer appended (greedy generation yields a sequence iff the argmax at every
    step is its next token), on the training forward, which the tests prove is the function the
    engine and transformers compute. Reports how far greedy follows the expected answer."""
    import torch

    expected = ", ".join(str(i) for i in range(1, n + 1))
    prompt = corpus.render_chat([{"role": "user", "content": f"Count from 1 to {n}."}], thinking=thinking,
                                add_generation_prompt=True)
    ids = tok.encode(prompt)
    prefix = tok.encode(f"The user wants the numbers from 1 to {n}.</think>") if thinking else []
    answer = prefix + tok.encode(expected) + [cfg.eos_token_id[0]]
    with torch.no_grad():
        logits = model(torch.tensor([ids + answer])).logits[0, len(ids) - 1:-1]
    greedy = logits.argmax(-1).tolist()
    first_bad = next((i for i, (g, a) in enumerate(zip(greedy, answer)) if g != a), None)
    ok_text = tok.decode(answer[:len(answer) if first_bad is None else first_bad])
    numbers = re.findall(r"\d+", ok_text.split("</think>")[-1])
    return {"ok": first_bad is None, "answer_tokens": len(answer),
            "greedy_follows_tokens": len(answer) if first_bad is None else first_bad,
            "last_number_reached": int(numbers[-1]) if numbers else None,
            "greedy_instead": None if first_bad is None else tok.decode([greedy[first_bad]])}


def check_counting(model_dir: Path, n: int = 200) -> dict:
    """Greedy chat "Count from 1 to n." gives 1..n and stops, reasoning off and on."""
    model, tok, cfg = _counting_model(model_dir)
    return {("thinking" if thinking else "plain"): _count_case(model, tok, cfg, n, thinking)
            for thinking in (False, True)}


def check_count_sweep(model_dir: Path, targets=range(2, 301)) -> dict:
    """The same check for every target n (reasoning off): how robust the stop is, not just at 200."""
    model, tok, cfg = _counting_model(model_dir)
    failed = {}
    for n in tqdm(list(targets), desc="count sweep"):
        case = _count_case(model, tok, cfg, n, thinking=False)
        if not case["ok"]:
            failed[n] = f"after {case['last_number_reached']}: {case['greedy_instead']!r}"
    return {"targets": f"{min(targets)}..{max(targets)}", "ok": len(targets) - len(failed), "of": len(targets),
            "failed": failed}


# --------------------------------------------------------------------------- 2. tool calls
def held_out_tool_cases(n: int = TOOL_PROMPTS, seed: int = TOOL_SEED) -> list[dict]:
    rng = random.Random(seed)
    cases = []
    for _ in range(n):
        tools = [corpus.make_tool(rng, held_out=True) for _ in range(rng.randint(1, 3))]
        tool = rng.choice(tools)
        args = corpus.tool_arguments(rng, tool)
        cases.append({"tools": tools, "user": corpus.tool_request(rng, tool["function"]["name"], args),
                      "thinking": rng.random() < 0.5})
    return cases


def schema_errors(args, schema: dict) -> list[str]:
    """The few JSON-schema rules our tools use: object, required, properties' type and enum."""
    if not isinstance(args, dict):
        return ["arguments are not an object"]
    errors = [f"missing {k}" for k in schema.get("required", []) if k not in args]
    props = schema.get("properties", {})
    kinds = {"string": str, "integer": int, "number": (int, float), "boolean": bool}
    for key, value in args.items():
        spec = props.get(key)
        if spec is None:
            errors.append(f"unknown argument {key}")
            continue
        want = kinds[spec["type"]]
        if isinstance(value, bool) and spec["type"] != "boolean" or not isinstance(value, want):
            errors.append(f"{key}: not {spec['type']}")
        if "enum" in spec and value not in spec["enum"]:
            errors.append(f"{key}: not in enum")
    return errors


def check_tools(model_dir: Path) -> dict:
    import httpx

    from tpserve.config import EngineConfig
    from tpserve.server.local import LocalServer

    from concurrent.futures import ThreadPoolExecutor

    server = LocalServer(EngineConfig(model=str(model_dir), device="cpu", dtype="float32"),
                         served_model_names=["demo"])

    def one(case: dict) -> dict:
        body = {"model": "demo", "messages": [{"role": "user", "content": case["user"]}],
                "tools": case["tools"], "temperature": 0, "max_tokens": 200,
                "chat_template_kwargs": {"enable_thinking": case["thinking"]}}
        with httpx.Client(base_url=server.url, timeout=3600) as client:
            plain = client.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]
            streamed = _stream(client, body)
        calls = [(c["function"]["name"], c["function"]["arguments"]) for c in plain.get("tool_calls") or []]
        schemas = {t["function"]["name"]: t["function"]["parameters"] for t in case["tools"]}
        valid = bool(calls) and all(name in schemas and not schema_errors(json.loads(arguments), schemas[name])
                                    for name, arguments in calls)
        same = calls == streamed["calls"] and (plain.get("content") or "") == streamed["content"]
        return {"valid": valid, "same": same, "user": case["user"], "calls": calls, "content": plain.get("content")}

    try:  # all prompts at once: the engine batches them
        with ThreadPoolExecutor(max_workers=TOOL_PROMPTS) as pool:
            results = list(tqdm(pool.map(one, held_out_tool_cases()), total=TOOL_PROMPTS, desc="tool prompts"))
    finally:
        server.close()
    return {"prompts": len(results), "valid": sum(r["valid"] for r in results),
            "stream_equal": sum(r["same"] for r in results), "cases": results}


def _stream(client, body: dict) -> dict:
    calls: dict[int, list[str]] = {}
    content = []
    with client.stream("POST", "/v1/chat/completions", json=dict(body, stream=True)) as resp:
        for line in resp.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            delta = json.loads(line[6:])["choices"][0]["delta"] if json.loads(line[6:])["choices"] else {}
            content.append(delta.get("content") or "")
            for tc in delta.get("tool_calls") or []:
                entry = calls.setdefault(tc["index"], ["", ""])
                fn = tc.get("function") or {}
                entry[0] += fn.get("name") or ""
                entry[1] += fn.get("arguments") or ""
    return {"calls": [tuple(calls[i]) for i in sorted(calls)], "content": "".join(content)}


# --------------------------------------------------------------------------- 3. MTP
def mtp_prompts() -> list[str]:
    out = [corpus.render_chat([{"role": "user", "content": u}], thinking=False, add_generation_prompt=True)
           for u in ("Count from 1 to 60.", "Count from 300 to 700 in steps of 25.",
                     "Write a JSON object with name Alice, age 31 and city Lima.",
                     "Make a JSON object where price = 12, label = \"fast\", open = true.")]
    for case in held_out_tool_cases(2, TOOL_SEED + 2):
        out.append(corpus.render_chat([{"role": "user", "content": case["user"]}], case["tools"], thinking=False,
                                      add_generation_prompt=True))
    return out


def check_mtp(model_dir: Path, k: int = 3, max_new_tokens: int = 48) -> dict:
    from transformers import AutoTokenizer

    from tpserve.model.config import ModelConfig
    from tpserve.train.model import TrainModel, load_checkpoint_
    from tpserve.train.mtp_eval import draft_and_verify

    cfg = ModelConfig.from_file(model_dir)
    model = TrainModel(cfg)
    load_checkpoint_(model, model_dir)
    model.eval()
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    per = []
    for prompt in tqdm(mtp_prompts(), desc="MTP drafting"):
        ids = tok.encode(prompt)
        stats = draft_and_verify(model, ids, max_new_tokens=max_new_tokens, k=k, stop_ids=set(cfg.eos_token_id))
        per.append({"drafted": stats["drafted"], "accepted": stats["accepted"], "rounds": stats["rounds"],
                    "text": tok.decode(stats["tokens"])})
    drafted, accepted = sum(p["drafted"] for p in per), sum(p["accepted"] for p in per)
    return {"k": k, "drafted": drafted, "accepted": accepted, "rate": accepted / max(1, drafted), "prompts": per}


# --------------------------------------------------------------------------- 4. GSM8K
def check_gsm8k(llm, data_dir: Path, n: int = 100, shots: int = 5) -> dict:
    from tpserve import SamplingParams

    def fmt(row):
        return f"Question: {row['question']}\nAnswer: {row['answer']}"

    train = [json.loads(x) for x in (data_dir / "train.jsonl").read_text().splitlines()[:shots]]
    test = [json.loads(x) for x in (data_dir / "test.jsonl").read_text().splitlines()[:n]]
    head = "\n\n".join(fmt(r) for r in train) + "\n\n"
    prompts = [head + f"Question: {r['question']}\nAnswer:" for r in test]
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=96, stop=["\n\nQuestion:", "Question:"]),
                        use_tqdm=True)
    correct = 0
    for r, o in zip(test, outs):
        gold = r["answer"].split("####")[-1].strip().replace(",", "")
        m = re.search(r"####\s*\$?(-?[\d,\.]+)", o.outputs[0].text)
        correct += bool(m) and m.group(1).replace(",", "").rstrip(".") == gold
    return {"questions": len(test), "shots": shots, "correct": correct, "accuracy": correct / max(1, len(test))}


def plot(results: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels, values, targets = [], [], []
    if "counting" in results:
        labels.append("count 1..200, stop")
        values.append(100.0 * all(results["counting"][k]["ok"] for k in ("plain", "thinking")))
        targets.append(100)
    if "tools" in results:
        t = results["tools"]
        labels += ["tool calls valid", "stream == plain"]
        values += [100 * t["valid"] / t["prompts"], 100 * t["stream_equal"] / t["prompts"]]
        targets += [90, 100]
    if "mtp" in results:
        labels.append("MTP accept (k=3)")
        values.append(100 * results["mtp"]["rate"])
        targets.append(60)
    if "gsm8k" in results:
        labels.append("GSM8K 5-shot")
        values.append(100 * results["gsm8k"]["accuracy"])
        targets.append(float("nan"))
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.bar(labels, values, color="tab:blue")
    marked = [(label, t) for label, t in zip(labels, targets) if t == t]  # GSM8K has no target (nan)
    if marked:
        ax.scatter([m[0] for m in marked], [m[1] for m in marked], color="tab:red", marker="_", s=900,
                   label="target")
        ax.legend()
    ax.set_ylabel("%")
    ax.set_ylim(0, 105)
    ax.set_title("built-in demo model: acceptance checks")
    plt.setp(ax.get_xticklabels(), rotation=15)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="checkpoint (default: the built-in demo model)")
    p.add_argument("--out", default="acceptance-out")
    p.add_argument("--gsm8k", default="/work/shared/data/gsm8k", help="folder with train.jsonl and test.jsonl")
    p.add_argument("--only", nargs="*", default=["counting", "tools", "mtp", "gsm8k"])
    args = p.parse_args(argv)
    model_dir = Path(args.model) if args.model else builtin_dir()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results: dict = {"model": str(model_dir)}
    llm = None
    if "gsm8k" in args.only:
        from tpserve import LLM

        llm = LLM(str(model_dir), device="cpu", dtype="float32")
    for name in args.only:
        t = time.time()
        if name == "counting":
            results[name] = check_counting(model_dir)
        elif name == "count_sweep":
            results[name] = check_count_sweep(model_dir)
        elif name == "tools":
            results[name] = check_tools(model_dir)
        elif name == "mtp":
            results[name] = check_mtp(model_dir)
        elif name == "gsm8k":
            results[name] = check_gsm8k(llm, Path(args.gsm8k))
        else:
            raise ValueError(f"--only: unknown check {name!r}")
        results[name]["seconds"] = round(time.time() - t, 1)
        summary = {k: v for k, v in results[name].items() if k not in ("cases", "prompts")} \
            if name != "tools" else {k: v for k, v in results[name].items() if k != "cases"}
        print(name, json.dumps(summary), flush=True)
        (out / "acceptance.json").write_text(json.dumps(results, indent=2) + "\n")
    if llm is not None:
        llm.shutdown()
    (out / "acceptance.json").write_text(json.dumps(results, indent=2) + "\n")
    plot(results, out / "acceptance.png")
    print(f"wrote {out / 'acceptance.json'} and {out / 'acceptance.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
