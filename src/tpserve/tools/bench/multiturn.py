"""`tpserve bench serve --dataset multiturn`: conversations that resend their whole history every turn, as chats
and agents do, with and without the prefix cache.

N conversations (--num-requests, default the concurrency) of --turns turns: the first prompt is --prompt-len
words, each later turn appends the model's answer (--max-tokens) and a new user message or tool result of
--turn-len words. --concurrency conversations run at once, each sending its next turn when its answer is
in, so the turns of different conversations interleave. The warm pass runs them live (cache_salt one per
conversation, so earlier runs cannot serve them); the cold pass replays exactly the same prompts with a
unique cache_salt per request, proving cached_tokens == 0. Reported per turn: the hit rate (cached tokens
over the ideal: the previous turn's prompt plus answer, at most all but the last prompt token), TTFT
percentiles of both passes and their ratio; the outputs of both passes are compared (greedy).
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid

from tpserve.tools.bench.load import percentile, summarize

_WORDS = ("alpha bravo river stone cloud paper seven orange window garden signal vector matrix kernel "
          "cache block token layer state queue thread socket packet engine server client module python "
          "number string answer result request report table column index value error retry branch").split()
_ROLES = ("User", "Tool result")


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(n))


def conversation_turns(n: int, turns: int, first_len: int, turn_len: int, seed: int) -> list[list[str]]:
    """Per conversation, the new text of each turn (the first is the opening prompt)."""
    rng = random.Random(seed)
    out = []
    for c in range(n):
        parts = [f"Conversation {c}. User: {words(rng, first_len)}\nAssistant:"]
        for t in range(1, turns):
            parts.append(f"\n{_ROLES[t % 2]}: {words(rng, turn_len)}\nAssistant:")
        out.append(parts)
    return out


async def _run(url: str, model: str, convs: list[list[str]], *, concurrency: int, max_tokens: int, headers: dict,
               replay: list[list[str]] | None = None) -> tuple[list[list[dict]], float]:
    """Each conversation's turns in order, `concurrency` conversations at a time. The warm pass (replay None)
    builds each prompt from the answers; the cold pass sends `replay`'s prompts, a fresh salt on each."""
    import httpx

    from tpserve.tools.bench.load import one_request

    sem = asyncio.Semaphore(concurrency)
    run = uuid.uuid4().hex[:12]
    limits = httpx.Limits(max_connections=concurrency + 8, max_keepalive_connections=concurrency + 8)
    async with httpx.AsyncClient(timeout=600, limits=limits, headers=headers) as client:
        async def conversation(c: int) -> list[dict]:
            results, history = [], ""
            async with sem:
                for t, part in enumerate(convs[c]):
                    prompt = replay[c][t] if replay is not None else history + part
                    salt = f"mt-{run}-{c}-{t}" if replay is not None else f"mt-{run}-{c}"
                    res = await one_request(client, url, model, prompt, max_tokens, replay is not None,
                                            {"cache_salt": salt})
                    res["prompt"] = prompt
                    results.append(res)
                    if res["error"]:
                        break
                    history = prompt + res["text"]
            return results

        start = time.perf_counter()
        results = await asyncio.gather(*(conversation(c) for c in range(len(convs))))
        return results, time.perf_counter() - start


def _turn_rows(warm: list[list[dict]], cold: list[list[dict]], turns: int) -> list[dict]:
    rows = []
    for t in range(turns):
        w = [conv[t] for conv in warm if len(conv) > t and not conv[t]["error"]]
        c = [conv[t] for conv in cold if len(conv) > t and not conv[t]["error"]]
        ideal = 0
        for conv in warm:
            if t and len(conv) > t and not conv[t]["error"]:
                prev = conv[t - 1]
                ideal += min(prev["prompt_tokens"] + prev["output_tokens"], conv[t]["prompt_tokens"] - 1)
        cached = sum(r["cached_tokens"] or 0 for r in w)
        pct = lambda rs: {f"p{q}": 1000 * percentile([r["ttft"] for r in rs if r["ttft"] is not None], q)  # noqa: E731
                          for q in (50, 90)}
        rows.append({"turn": t + 1, "requests": len(w), "prompt_tokens_mean": sum(r["prompt_tokens"] for r in w)
                     / max(len(w), 1), "cached_tokens": cached, "ideal_tokens": ideal,
                     "hit_rate": cached / ideal if ideal else None, "ttft_ms": pct(w), "ttft_cold_ms": pct(c)})
    return rows


def bench_multiturn(url: str, args, headers: dict, model: str, concurrency: int) -> dict:
    """One level: the warm pass, then the cold replay of its prompts."""
    n = args.num_requests or concurrency
    convs = conversation_turns(n, args.turns, args.prompt_len, args.turn_len, args.prompt_seed)
    warm, warm_s = asyncio.run(_run(url, model, convs, concurrency=concurrency, max_tokens=args.max_tokens,
                                    headers=headers))
    replay = [[r["prompt"] for r in conv] for conv in warm]
    cold, cold_s = asyncio.run(_run(url, model, convs, concurrency=concurrency, max_tokens=args.max_tokens,
                                    headers=headers, replay=replay))
    flat_w, flat_c = [r for conv in warm for r in conv], [r for conv in cold for r in conv]
    level = summarize(flat_w, warm_s, concurrency=concurrency, max_tokens=args.max_tokens, cold=False)
    level["cold_pass"] = summarize(flat_c, cold_s, concurrency=concurrency, max_tokens=args.max_tokens, cold=True)
    level["errors"] = level["errors"] + level["cold_pass"]["errors"]
    level["turns"] = _turn_rows(warm, cold, args.turns)
    later = level["turns"][1:]
    ideal = sum(row["ideal_tokens"] for row in later)
    level["hit_rate"] = sum(row["cached_tokens"] for row in later) / ideal if ideal else None
    level["outputs_identical"] = sum(a["text"] == b["text"] for a, b in zip(flat_w, flat_c))
    level["outputs_compared"] = min(len(flat_w), len(flat_c))
    w, c = level["ttft_ms"]["p50"], level["cold_pass"]["ttft_ms"]["p50"]
    level["ttft_p50_ratio"] = w / c if c else None
    cw, cc = level["output_tok_per_s"], level["cold_pass"]["output_tok_per_s"]
    level["output_tok_per_s_ratio"] = cw / cc if cc else None
    level["cold_valid"] = level["cold_pass"]["cold_valid"]
    level["cold_violations"] = level["cold_pass"]["cold_violations"]
    return level


def report_lines(level: dict) -> list[str]:
    f = lambda x, spec=".1f": "-" if x is None else format(x, spec)  # noqa: E731
    lines = [f"multi-turn at concurrency {level['concurrency']}: hit rate {f(level['hit_rate'], '.1%')} of the "
             f"ideal; TTFT p50 {f(level['ttft_ms']['p50'])} ms against {f(level['cold_pass']['ttft_ms']['p50'])} "
             f"ms without the cache ({f(level['ttft_p50_ratio'], '.3f')}x); output {f(level['output_tok_per_s'])} "
             f"against {f(level['cold_pass']['output_tok_per_s'])} tok/s ({f(level['output_tok_per_s_ratio'], '.2f')}"
             f"x); outputs identical {level['outputs_identical']}/{level['outputs_compared']}",
             "| turn | requests | prompt tokens | cached | ideal | hit rate | TTFT p50/p90 ms | no cache p50/p90 ms |",
             "|" + " --- |" * 8]
    lines.insert(1, "no-cache pass: " + ("VALID, cached_tokens == 0 in every response" if level["cold_valid"]
                                         else "INVALID: " + "; ".join(level["cold_violations"][:3])))
    for row in level["turns"]:
        lines.append(f"| {row['turn']} | {row['requests']} | {row['prompt_tokens_mean']:.0f} | {row['cached_tokens']}"
                     f" | {row['ideal_tokens']} | {f(row['hit_rate'], '.1%')} | "
                     f"{f(row['ttft_ms']['p50'])}/{f(row['ttft_ms']['p90'])} | "
                     f"{f(row['ttft_cold_ms']['p50'])}/{f(row['ttft_cold_ms']['p90'])} |")
    return lines


def plot_multiturn(res: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for k, level in enumerate(res["levels"]):
        turns = [row["turn"] for row in level["turns"]]
        c = level["concurrency"]
        axes[0].plot(turns, [row["ttft_ms"]["p50"] for row in level["turns"]], marker="o", color=f"C{k}",
                     label=f"cache, concurrency {c}")
        axes[0].plot(turns, [row["ttft_cold_ms"]["p50"] for row in level["turns"]], marker="x", linestyle="--",
                     color=f"C{k}", label=f"no cache, concurrency {c}")
        axes[1].plot(turns[1:], [100 * (row["hit_rate"] or 0) for row in level["turns"][1:]], marker="o",
                     color=f"C{k}", label=f"concurrency {c}")
    axes[0].set_title("TTFT p50 per turn (ms)")
    axes[1].set_title("prefix cache hit rate per turn (% of ideal)")
    axes[1].set_ylim(0, 105)
    for ax in axes:
        ax.set_xlabel("turn")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{res['model']} at {res['url']}: multi-turn, {res['max_tokens']} tokens per answer")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
