"""GSM8K, 5-shot: the first five train problems as worked examples, then a test question;
greedy completion; correct when the final number equals the reference's (after "####")."""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tpserve.tools.client import Client, ToolError, emit_json, friendly

SHOTS = 5
_NUMBER = re.compile(r"-?[\d,]*\.?\d+")


def default_data_dir() -> Path | None:
    here = Path(__file__).resolve()
    for root in (Path.cwd() / ".." / "shared" / "data", here.parents[3] / ".." / "shared" / "data"):
        if (root / "gsm8k" / "test.jsonl").is_file():
            return root.resolve()
    return None


def load(data: str | None) -> tuple[list[dict], list[dict]]:
    root = Path(data) if data else default_data_dir()
    if root is None:
        raise ToolError("no GSM8K data found: pass --data DIR (holding gsm8k/train.jsonl and gsm8k/test.jsonl)")
    sets = []
    for split in ("train", "test"):
        path = root / "gsm8k" / f"{split}.jsonl"
        if not path.is_file():
            raise ToolError(f"--data {root}: {path} does not exist")
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        if any(not isinstance(r.get("question"), str) or "####" not in str(r.get("answer")) for r in rows):
            raise ToolError(f"{path}: each line needs 'question' and an 'answer' with '#### N'")
        sets.append(rows)
    if len(sets[0]) < SHOTS:
        raise ToolError(f"{root}/gsm8k/train.jsonl has fewer than {SHOTS} examples")
    return sets[0], sets[1]


def number(text: str) -> float | None:
    """The final answer: after the last '####' if present, else the last number in the text."""
    tail = text.rsplit("####", 1)[1] if "####" in text else text
    found = _NUMBER.findall(tail.replace("$", ""))
    if not found:
        return None
    pick = found[0] if "####" in text else found[-1]
    try:
        return float(pick.replace(",", ""))
    except ValueError:
        return None


def prompt(shots: list[dict], question: str) -> str:
    parts = [f"Question: {s['question']}\nAnswer: {s['answer']}\n\n" for s in shots[:SHOTS]]
    return "".join(parts) + f"Question: {question}\nAnswer:"


@friendly
def run(args) -> int:
    from tqdm import tqdm

    train, test = load(args.data)
    test = test[:args.limit]
    c = Client(args.url, args.api_key, args.served_model)
    model = c.model

    def ask(row):
        r = c.post("/v1/completions", {"model": model, "prompt": prompt(train, row["question"]), "temperature": 0,
                                       "max_tokens": args.max_tokens, "stop": ["\n\nQuestion:", "Question:"]})
        text = r["choices"][0]["text"]
        got, want = number(text), number(row["answer"])
        return {"question": row["question"], "answer": want, "got": got, "correct": got is not None and
                abs(got - want) < 1e-6, "completion": text}

    try:
        with ThreadPoolExecutor(max(1, args.concurrency)) as pool:
            rows = list(tqdm(pool.map(ask, test), total=len(test), desc="gsm8k", unit="q", leave=False))
    finally:
        c.close()
    correct = sum(r["correct"] for r in rows)
    res = {"task": "gsm8k", "url": c.url, "model": model, "shots": SHOTS, "questions": len(rows), "correct": correct,
           "accuracy": correct / len(rows) if rows else 0.0, "results": rows}
    if args.json_out != "-":
        print(f"gsm8k {SHOTS}-shot on {c.url} ({model}): {correct}/{len(rows)} = {res['accuracy']:.1%}")
    emit_json(args.json_out, res)
    return 0
