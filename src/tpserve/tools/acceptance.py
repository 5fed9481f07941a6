"""Acceptance checks of the built-in demo model. Run:

    python -m tpserve.tools.acceptance [--model DIR] [--out DIR] [--only CHECK ...] [--device cpu]

counting     greedy chat "Count from 1 to 200." (reasoning off and on) gives 1..200 in order and stops.
tools        30 prompts that name a tool held out of training (new names and argument schemas),
             through the OpenAI server (in-process): the share of valid calls (our parser accepts the
             call, it names a given tool, its arguments validate against its JSON schema); streamed ==
             non-streamed.
plain_tools  30 prompts in plain words that never name the tool, tools of held-out topics and names:
             valid calls, the right tool, the right arguments (served_checks.py).
one_word     20 questions asked for a one-word answer.
clients      `tpserve smoke`, `tpserve quality count` (chat and --raw) and `tpserve agent-tools` against
             the in-process server.
mtp          MTP acceptance at k=3, greedy, on structured prompts (counting, JSON, tool calls), with the
             plain torch drafting loop over the training forward (train/mtp_eval.py).
gsm8k        GSM8K 5-shot on the first 100 test questions (shots: the first 5 training questions).
Also `--only count_sweep`: the counting check for every target from 2 to 300 (reasoning off), and
`--only plain_tools_strict`: plain_tools with every tool `strict` (the server constrains the calls), not
run by default. Writes OUT/acceptance.json and OUT/acceptance.png.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path

from tqdm import tqdm

from tpserve.train import corpus
from tpserve.tools.served_checks import (TOOL_SEED, Served, check_clients, check_one_word, check_plain_tools,
                                         check_tools, held_out_tool_cases)

SERVED = {"tools": check_tools, "plain_tools": check_plain_tools, "one_word": check_one_word,
          "clients": check_clients, "plain_tools_strict": lambda served: check_plain_tools(served, strict=True)}


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
    if "plain_tools" in results:
        t = results["plain_tools"]
        labels += ["plain words: valid", "plain words: right args"]
        values += [100 * t["valid"] / t["prompts"], 100 * t["right_args"] / t["prompts"]]
        targets += [90, float("nan")]
    if "one_word" in results:
        labels.append("one-word answers")
        values.append(100 * results["one_word"]["right"] / results["one_word"]["prompts"])
        targets.append(float("nan"))
    if "clients" in results:
        c = results["clients"]
        labels += ["smoke", "agent-tools"]
        values += [100 * c["smoke_passed"] / len(c["smoke"]), 10 * c["agent_tools_passed"]]
        targets += [100 * (len(c["smoke"]) - 1) / len(c["smoke"]), 60]
    if "mtp" in results:
        labels.append("MTP accept (k=3)")
        values.append(100 * results["mtp"]["rate"])
        targets.append(60)
    if "gsm8k" in results:
        labels.append("GSM8K 5-shot")
        values.append(100 * results["gsm8k"]["accuracy"])
        targets.append(float("nan"))
    fig, ax = plt.subplots(figsize=(max(7, 1.1 * len(labels)), 3.8))
    ax.bar(labels, values, color="tab:blue")
    marked = [(label, t) for label, t in zip(labels, targets) if t == t]  # nan: no target
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


def goals(results: dict) -> dict:
    """The demo model's targets, for the checks that ran: True/False each."""
    out = {}
    if "plain_tools" in results:
        t = results["plain_tools"]
        out["plain_tools: >= 90% valid calls"] = t["valid"] >= 0.9 * t["prompts"]
    if "clients" in results:
        c = results["clients"]
        out["smoke: every check but factual"] = all(ok for name, ok in c["smoke"].items() if name != "factual")
        out["quality count (chat)"] = c["count"]["chat"]["ok"]
        out["agent-tools: >= 6/10"] = c["agent_tools_passed"] >= 6
    if "mtp" in results:
        out["mtp: >= 60% accepted"] = results["mtp"]["rate"] >= 0.6
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="checkpoint (default: the built-in demo model)")
    p.add_argument("--out", default="acceptance-out")
    p.add_argument("--gsm8k", default="/work/shared/data/gsm8k", help="folder with train.jsonl and test.jsonl")
    p.add_argument("--only", nargs="*", default=["counting", "tools", "plain_tools", "one_word", "clients", "mtp",
                                                 "gsm8k"])
    p.add_argument("--device", default="cpu", help="device of the served checks' engine (cpu, cuda)")
    args = p.parse_args(argv)
    unknown = set(args.only) - {"counting", "count_sweep", "mtp", "gsm8k", *SERVED}
    if unknown:
        raise ValueError(f"--only: unknown checks {sorted(unknown)}")
    model_dir = Path(args.model) if args.model else builtin_dir()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results: dict = {"model": str(model_dir)}
    llm = served = None
    if "gsm8k" in args.only:
        from tpserve import LLM

        llm = LLM(str(model_dir), device="cpu", dtype="float32")
    try:
        for name in args.only:
            t = time.time()
            if name in SERVED:
                served = served or Served(model_dir, args.device)
                results[name] = SERVED[name](served)
            elif name == "counting":
                results[name] = check_counting(model_dir)
            elif name == "count_sweep":
                results[name] = check_count_sweep(model_dir)
            elif name == "mtp":
                results[name] = check_mtp(model_dir)
            else:
                results[name] = check_gsm8k(llm, Path(args.gsm8k))
            results[name]["seconds"] = round(time.time() - t, 1)
            summary = {k: v for k, v in results[name].items() if k != "cases" and not isinstance(v, list)}
            print(name, json.dumps(summary), flush=True)
            (out / "acceptance.json").write_text(json.dumps(results, indent=2) + "\n")
    finally:
        if llm is not None:
            llm.shutdown()
        if served is not None:
            served.close()
    results["goals"] = goals(results)
    for goal, ok in results["goals"].items():
        print(f"{'PASS' if ok else 'FAIL'}  {goal}")
    (out / "acceptance.json").write_text(json.dumps(results, indent=2) + "\n")
    plot(results, out / "acceptance.png")
    print(f"wrote {out / 'acceptance.json'} and {out / 'acceptance.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
