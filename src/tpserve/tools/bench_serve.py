"""`tpserve bench serve`: a load test over the OpenAI API (concurrent streaming completions).

Starts a server in this process (or targets --url), runs --concurrency streaming clients that
each ask for --max-tokens tokens, and reports throughput, TTFT / inter-token percentiles,
errors, and whether the cache pool is full again at the end.
"""

from __future__ import annotations

import json

from tpserve.tools.common import add_engine_args, engine_config_from_args


def register(sub, bench, tune) -> None:
    p = bench.add_parser("serve", help="load test: concurrent streaming requests against the server")
    add_engine_args(p)
    p.add_argument("--url", default=None, help="an already running server (default: start one here)")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--num-requests", type=int, default=None, help="default: --concurrency")
    p.add_argument("--max-tokens", type=int, default=200)
    p.add_argument("--prompt-len", type=int, default=32, help="prompt length in tokens")
    p.add_argument("--json", dest="json_out", default=None, help="write the results as JSON here")
    p.add_argument("--plot", default=None, help="write a PNG of the TTFT and latency distributions here")
    p.set_defaults(func=run)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    k = (len(s) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


async def _one(client, url: str, i: int, prompt_len: int, max_tokens: int) -> dict:
    import time

    body = {"prompt": [(7 * i + j) % 250 + 3 for j in range(prompt_len)], "max_tokens": max_tokens,
            "stream": True, "ignore_eos": True, "temperature": 0}
    start = time.perf_counter()
    stamps, error = [], None
    try:
        async with client.stream("POST", url + "/v1/completions", json=body) as r:
            if r.status_code != 200:
                return {"error": f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"}
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    error = chunk["error"]["message"]
                elif chunk.get("choices"):
                    stamps.append(time.perf_counter())
    except Exception as exc:  # noqa: BLE001 - counted and reported
        error = f"{type(exc).__name__}: {exc}"
    end = time.perf_counter()
    return {"ttft": stamps[0] - start if stamps else None, "latency": end - start, "chunks": len(stamps),
            "itl": [b - a for a, b in zip(stamps, stamps[1:])], "error": error}


async def load(url: str, concurrency: int, num_requests: int, prompt_len: int, max_tokens: int) -> dict:
    import asyncio
    import time

    import httpx
    from tqdm import tqdm

    sem = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency + 8, max_keepalive_connections=concurrency + 8)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        bar = tqdm(total=num_requests, desc="requests", unit="req")

        async def guarded(i):
            async with sem:
                res = await _one(client, url, i, prompt_len, max_tokens)
                bar.update(1)
                return res

        start = time.perf_counter()
        results = await asyncio.gather(*(guarded(i) for i in range(num_requests)))
        duration = time.perf_counter() - start
        bar.close()
        metrics = (await client.get(url + "/metrics")).text
    usage = {line.split()[0]: float(line.split()[1]) for line in metrics.splitlines()
             if line.startswith(("tpserve:num_requests_running", "tpserve:kv_cache_usage_perc",
                                 "tpserve:kda_slot_usage_perc"))}
    ok = [r for r in results if not r["error"]]
    ttft = [r["ttft"] for r in ok if r["ttft"] is not None]
    itl = [x for r in ok for x in r["itl"]]
    tokens = max_tokens * len(ok)
    return {"requests": num_requests, "concurrency": concurrency, "max_tokens": max_tokens, "prompt_len": prompt_len,
            "errors": [r["error"] for r in results if r["error"]], "duration_s": duration,
            "output_tok_per_s": tokens / duration, "requests_per_s": len(ok) / duration,
            "ttft_ms": {q: 1000 * percentile(ttft, q) for q in (50, 90, 99)},
            "itl_ms": {q: 1000 * percentile(itl, q) for q in (50, 90, 99)},
            "latency_s": {q: percentile([r["latency"] for r in ok], q) for q in (50, 99)},
            "pool_after": usage, "raw_ttft": ttft, "raw_latency": [r["latency"] for r in ok]}


def report(res: dict) -> str:
    lines = [f"requests {res['requests']} (concurrency {res['concurrency']}), {res['max_tokens']} tokens each, "
             f"prompt {res['prompt_len']} tokens",
             f"errors {len(res['errors'])}",
             f"duration {res['duration_s']:.2f} s, {res['output_tok_per_s']:.1f} output tok/s, "
             f"{res['requests_per_s']:.2f} req/s",
             "| metric | p50 | p90 | p99 |", "| --- | --- | --- | --- |",
             "| TTFT (ms) | {:.1f} | {:.1f} | {:.1f} |".format(*res["ttft_ms"].values()),
             "| inter-token (ms) | {:.1f} | {:.1f} | {:.1f} |".format(*res["itl_ms"].values()),
             f"after the run: {res['pool_after']}"]
    return "\n".join(lines)


def plot(res: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key, label in ((axes[0], "raw_ttft", "time to first token (s)"),
                           (axes[1], "raw_latency", "request latency (s)")):
        vals = sorted(res[key])
        ax.plot(vals, [(i + 1) / len(vals) for i in range(len(vals))])
        ax.set_xlabel(label)
        ax.set_ylabel("fraction of requests")
        ax.grid(True, alpha=0.3)
    fig.suptitle(f"{res['requests']} streams x {res['max_tokens']} tokens: {res['output_tok_per_s']:.0f} tok/s")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def run(args) -> int:
    import asyncio

    server = None
    url = args.url
    if url is None:
        from tpserve.server.local import LocalServer

        server = LocalServer(engine_config_from_args(args))
        url = server.url
    try:
        res = asyncio.run(load(url, args.concurrency, args.num_requests or args.concurrency, args.prompt_len,
                               args.max_tokens))
        if server is not None:
            res["pool_full_after"] = server.pools_full()
    finally:
        if server is not None:
            server.close()
    print(report(res))
    if server is not None:
        print(f"pool full again: {res['pool_full_after']}")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({k: v for k, v in res.items() if not k.startswith("raw_")}, f, indent=2)
    if args.plot:
        plot(res, args.plot)
    return 1 if res["errors"] or res.get("pool_full_after") is False else 0
