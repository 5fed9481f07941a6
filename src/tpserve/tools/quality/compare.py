"""Checks that compare servers or settings token by token.

nll        per-token negative log-likelihood of a fixed text (vLLM's `prompt_logprobs`), on one
           URL or two (--url2): the way to show an FP8 or kernel switch costs nothing.
divergence n greedy runs on both URLs: the first token position where they differ.
count      "Count from 1 to 200": every number must come, in order; asked as a chat message (what any
           chat client sends), or with --raw as a completion to continue ("... 1, 2, 3,").
"""

from __future__ import annotations

import math
import re

from tpserve.tools.client import Client, ToolError, emit_json, friendly

TEXT = ("The lighthouse stood at the end of a long spit of sand, and every evening the keeper climbed its "
        "one hundred and twelve steps to light the lamp. Ships passing in the night saw its beam sweep across "
        "the water once every ten seconds, and they knew where the rocks were. In the winter storms the keeper "
        "wrote in his logbook by candlelight: the wind speed, the height of the waves, the names of the "
        "ships that had passed. After forty years the lamp was automated, and the keeper moved to a small "
        "house in the village, where he could still see the beam from his kitchen window.")
PROMPTS = ["Once upon a time", "The capital of France is", "def fibonacci(n):", "1, 2, 3, 4,",
           "The quick brown fox", "In a distant galaxy", "Water boils at", "The best way to learn is"]
COUNT_PROMPT = "Count from 1 to 200, separated by commas: 1, 2, 3,"
COUNT_MESSAGE = "Count from 1 to 200, separated by commas."


def prompt_nll(c: Client, text: str) -> tuple[list[str], list[float]]:
    """(prompt token ids, NLL of each token after the first) from prompt_logprobs=0."""
    r = c.post("/v1/completions", {"model": c.model, "prompt": text, "max_tokens": 1, "temperature": 0,
                                   "prompt_logprobs": 0})
    entries = (r.get("choices") or [{}])[0].get("prompt_logprobs", r.get("prompt_logprobs"))
    if not isinstance(entries, list) or len(entries) < 2:
        raise ToolError(f"{c.url} returned no prompt_logprobs (the server must support vLLM's prompt_logprobs)")
    tokens, nll = [], []
    for e in entries[1:]:
        if not isinstance(e, dict) or len(e) != 1:
            raise ToolError(f"{c.url}: prompt_logprobs=0 should give one entry per position, got {str(e)[:80]}")
        (tok, lp), = e.items()
        tokens.append(tok)
        nll.append(-float(lp["logprob"] if isinstance(lp, dict) else lp))
    return tokens, nll


def run_nll(args, clients: list[Client]) -> tuple[dict, int, list[str]]:
    from tqdm import tqdm

    text = open(args.text_file).read() if args.text_file else TEXT
    runs = [prompt_nll(c, text) for c in tqdm(clients, desc="nll", unit="server", leave=False)]
    res = {"task": "nll", "urls": [c.url for c in clients], "tokens": len(runs[0][1]),
           "mean_nll": [sum(n) / len(n) for _, n in runs], "per_token_nll": [n for _, n in runs]}
    rc = 0
    lines = [f"{c.url}: mean NLL {m:.5f} nats over {len(n)} tokens (ppl {math.exp(m):.2f})"
             for c, m, (_, n) in zip(clients, res["mean_nll"], runs)]
    if len(runs) == 2:
        if runs[0][0] != runs[1][0]:
            raise ToolError("the two servers tokenize the text differently: their NLLs cannot be compared")
        diff = [b - a for a, b in zip(runs[0][1], runs[1][1])]
        res["mean_diff"] = res["mean_nll"][1] - res["mean_nll"][0]
        res["max_abs_token_diff"] = max(abs(d) for d in diff)
        res["within_tolerance"] = abs(res["mean_diff"]) <= args.tolerance
        rc = 0 if res["within_tolerance"] else 1
        lines.append(f"difference (2nd - 1st): mean {res['mean_diff']:+.6f} nats, largest per token "
                     f"{res['max_abs_token_diff']:.6f}: {'PASS' if rc == 0 else 'FAIL'} (tolerance {args.tolerance})")
    if args.plot:
        _plot_nll(res, args.plot)
    return res, rc, lines


def _plot_nll(res: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(res["per_token_nll"]), figsize=(12, 3.5), squeeze=False)
    for url, nll in zip(res["urls"], res["per_token_nll"]):
        axes[0][0].plot(nll, label=url, lw=1)
    axes[0][0].set_xlabel("token")
    axes[0][0].set_ylabel("NLL (nats)")
    axes[0][0].legend(fontsize=7)
    if len(res["per_token_nll"]) == 2:
        a, b = res["per_token_nll"]
        axes[0][1].plot([y - x for x, y in zip(a, b)], color="C3", lw=1)
        axes[0][1].set_title("difference (2nd - 1st)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def greedy_tokens(c: Client, prompt: str, max_tokens: int) -> list[str]:
    r = c.post("/v1/completions", {"model": c.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                                   "logprobs": 0, "seed": 0})
    ch = (r.get("choices") or [{}])[0]
    toks = (ch.get("logprobs") or {}).get("tokens")
    return list(toks) if toks else list(ch.get("text", ""))  # no logprobs: compare characters


def run_divergence(args, clients: list[Client]) -> tuple[dict, int, list[str]]:
    from tqdm import tqdm

    if len(clients) != 2:
        raise ToolError("divergence compares two servers: give --url and --url2")
    prompts = [PROMPTS[i % len(PROMPTS)] + ("" if i < len(PROMPTS) else f" ({i})") for i in range(args.n)]
    rows = []
    for p in tqdm(prompts, desc="divergence", unit="run", leave=False):
        a, b = (greedy_tokens(c, p, args.max_tokens) for c in clients)
        first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
        if first is None and len(a) != len(b):
            first = min(len(a), len(b))
        rows.append({"prompt": p, "first_difference": first, "length": [len(a), len(b)],
                     "at": None if first is None else [a[first] if first < len(a) else None,
                                                       b[first] if first < len(b) else None]})
    same = sum(r["first_difference"] is None for r in rows)
    lines = [f"{'same' if r['first_difference'] is None else 'differs at ' + str(r['first_difference'])}: "
             f"{r['prompt']!r}" + (f" ({r['at'][0]!r} vs {r['at'][1]!r})" if r["at"] else "") for r in rows]
    lines.append(f"{same}/{len(rows)} greedy runs identical over up to {args.max_tokens} tokens")
    return {"task": "divergence", "urls": [c.url for c in clients], "runs": rows, "identical": same}, \
        (0 if same == len(rows) else 1), lines


def check_count(text: str, start: int = 4, end: int = 200, anywhere: bool = False) -> tuple[bool, str]:
    """The numbers of `text` must run start..end in order: from its first number (the continuation
    of '1, 2, 3,'), or with `anywhere` from the occurrence of `start` that runs furthest (a chat
    answer may open with a sentence), and then not go on to end + 1."""
    numbers = [int(x) for x in re.findall(r"\d+", text)]
    firsts = [i for i, n in enumerate(numbers) if n == start] if anywhere else [0]
    best = (-1, "no numbers" if not numbers else f"no {start} to start from")
    for first in firsts:
        run = numbers[first:]
        k = next((k for k, want in enumerate(range(start, end + 1)) if k >= len(run) or run[k] != want), None)
        if k is None:
            if anywhere and len(run) > end - start + 1 and run[end - start + 1] == end + 1:
                return False, f"counted on past {end}"
            return True, f"counted to {end}"
        why = f"stopped after {start + k - 1}" if k >= len(run) else f"expected {start + k}, got {run[k]}"
        best = max(best, (k, why))
    return False, best[1]


def run_count(args, clients: list[Client]) -> tuple[dict, int, list[str]]:
    rows = []
    for c in clients:
        if args.raw:
            r = c.post("/v1/completions", {"model": c.model, "prompt": COUNT_PROMPT, "max_tokens": args.max_tokens,
                                           "temperature": 0})
            text = r["choices"][0]["text"]
            ok, why = check_count(text)
        else:
            messages = [{"role": "user", "content": COUNT_MESSAGE}]
            r = c.post("/v1/chat/completions", {"model": c.model, "messages": messages,
                                                "max_tokens": args.max_tokens, "temperature": 0})
            text = r["choices"][0]["message"].get("content") or ""
            ok, why = check_count(text, start=1, anywhere=True)
        rows.append({"url": c.url, "ok": ok, "reason": why, "text": text})
    lines = [f"{'PASS' if r['ok'] else 'FAIL'} {r['url']}: {r['reason']}" for r in rows]
    return {"task": "count", "mode": "raw" if args.raw else "chat", "results": rows}, \
        (0 if all(r["ok"] for r in rows) else 1), lines


@friendly
def run(args) -> int:
    urls = [args.url] + ([args.url2] if getattr(args, "url2", None) else [])
    clients = [Client(u, args.api_key, args.served_model) for u in urls]
    try:
        for c in clients:
            _ = c.model
        task = {"nll": run_nll, "divergence": run_divergence, "count": run_count}[args.quality_task]
        res, rc, lines = task(args, clients)
    finally:
        for c in clients:
            c.close()
    if args.json_out != "-":
        print("\n".join(lines))
    emit_json(args.json_out, res)
    return rc
