"""`tpserve bench soak`: a long run of concurrent streaming clients, some of which hang up early.

Reports requests, errors (anything but a finished stream or an intended hang-up), whether every
pool (cache blocks, KDA slots) is full again afterwards, and the process RSS at the start and end
(the server runs in this process) with its slope after the first minute (warm-up), and the same
slope of glibc's heap in use (so a drift can be told apart: bytes in use vs memory malloc keeps).
--plot writes RSS and completed requests over time as a PNG.
"""

from __future__ import annotations

import asyncio
import json
import random
import time

from tpserve.server.memory import glibc, heap_mib
from tpserve.tools.common import add_engine_args, engine_config_from_args

WARMUP_S = 60.0  # slopes leave out the first minute (allocator pools, the first batch of every size)


def register(sub, bench, tune) -> None:
    p = bench.add_parser("soak", help="long load with client disconnects: errors, pools, RSS")
    add_engine_args(p)
    p.add_argument("--duration", type=float, default=60.0, help="seconds of load")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--disconnect-fraction", type=float, default=0.1,
                   help="fraction of requests whose client hangs up after a random number of chunks")
    p.add_argument("--max-tokens", type=int, default=64, help="most new tokens per request (random 1..this)")
    p.add_argument("--json", dest="json_out", default=None, help="write the results as JSON here")
    p.add_argument("--plot", default=None, help="write a PNG of RSS and completed requests over time here")
    p.set_defaults(func=run)


def slope_per_min(timeline: list, column: int, after: float = WARMUP_S) -> float | None:
    """Least-squares slope (units per minute) of timeline[column] over the samples after `after` s."""
    points = [(row[0], row[column]) for row in timeline if row[0] >= after and row[column] is not None]
    if len(points) < 3:
        return None
    n = len(points)
    mt, mv = sum(p[0] for p in points) / n, sum(p[1] for p in points) / n
    var = sum((p[0] - mt) ** 2 for p in points)
    return 60 * sum((p[0] - mt) * (p[1] - mv) for p in points) / var if var else None


def rss_mib() -> float:
    """This process's resident set size (Linux /proc)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


async def _client(url: str, rng: random.Random, deadline: float, args, stats: dict) -> None:
    import httpx

    async with httpx.AsyncClient(timeout=120) as client:
        while time.monotonic() < deadline:
            hang_up_after = rng.randint(1, 4) if rng.random() < args.disconnect_fraction else None
            chat = rng.random() < 0.5
            n = rng.randint(1, args.max_tokens)
            if chat:
                path, body = "/v1/chat/completions", {"messages": [{"role": "user", "content": f"soak {rng.random()}"}]}
            else:
                path, body = "/v1/completions", {"prompt": [rng.randint(3, 250) for _ in range(rng.randint(1, 48))]}
            body.update(max_tokens=n, stream=True, ignore_eos=True, temperature=rng.choice([0, 0.8]))
            try:
                async with client.stream("POST", url + path, json=body) as r:
                    if r.status_code != 200:
                        stats["errors"].append(f"HTTP {r.status_code}: {(await r.aread())[:200]!r}")
                        continue
                    chunks, done = 0, False
                    async for line in r.aiter_lines():
                        if line == "data: [DONE]":
                            done = True
                        elif line.startswith("data: "):
                            if '"error"' in line[:20]:
                                stats["errors"].append(line[:200])
                            chunks += 1
                            if hang_up_after is not None and chunks >= hang_up_after:
                                break
                    if hang_up_after is not None and not done:
                        stats["disconnects"] += 1
                    elif done:
                        stats["completed"] += 1
                    else:
                        stats["errors"].append("stream ended without [DONE]")
            except Exception as exc:  # noqa: BLE001 - counted and reported
                stats["errors"].append(f"{type(exc).__name__}: {exc}")


async def soak(url: str, args) -> dict:
    stats = {"completed": 0, "disconnects": 0, "errors": [], "timeline": []}
    deadline = time.monotonic() + args.duration
    start = time.monotonic()

    libc = glibc()

    async def sample():
        while time.monotonic() < deadline:
            heap = heap_mib(libc) or {}
            stats["timeline"].append((time.monotonic() - start, rss_mib(), stats["completed"], heap.get("in_use"),
                                      heap.get("free")))
            await asyncio.sleep(1.0)

    rngs = [random.Random((args.seed or 0) * 100_003 + i) for i in range(args.concurrency)]
    await asyncio.gather(sample(), *(_client(url, rng, deadline, args, stats) for rng in rngs))
    return stats


def run(args) -> int:
    from tqdm import tqdm

    from tpserve.server.local import LocalServer

    if args.concurrency < 1 or args.duration <= 0 or not 0 <= args.disconnect_fraction <= 1:
        raise ValueError("--concurrency >= 1, --duration > 0 and --disconnect-fraction in [0, 1] are needed")
    cfg = engine_config_from_args(args)
    server = LocalServer(cfg)
    try:
        rss_start = rss_mib()
        with tqdm(total=int(args.duration), desc="soak (s)") as bar:
            async def ticking():
                task = asyncio.ensure_future(soak(server.url, args))
                while not task.done():
                    await asyncio.sleep(1.0)
                    bar.update(min(1, bar.total - bar.n))
                return task.result()

            stats = asyncio.run(ticking())
        deadline = time.monotonic() + 10
        while not server.pools_full() and time.monotonic() < deadline:
            time.sleep(0.1)
        pools_full = server.pools_full()
        rss_end = rss_mib()
        trimmer = server.state.trimmer
    finally:
        server.close()
    slopes = {"rss_slope_mib_per_min": slope_per_min(stats["timeline"], 1),
              "heap_in_use_slope_mib_per_min": slope_per_min(stats["timeline"], 3)}
    result = {"duration_s": args.duration, "concurrency": args.concurrency,
              "disconnect_fraction": args.disconnect_fraction, "completed": stats["completed"],
              "disconnects": stats["disconnects"], "errors": len(stats["errors"]),
              "pools_full_after": pools_full, "rss_start_mib": round(rss_start, 1), "rss_end_mib": round(rss_end, 1),
              **{k: None if v is None else round(v, 3) for k, v in slopes.items()},
              "malloc_trim_interval_s": server.state.malloc_trim_interval,
              "malloc_trims": trimmer.calls if trimmer else 0,
              "malloc_trim_max_ms": round(trimmer.max_seconds * 1000, 2) if trimmer else None}
    for key, value in result.items():
        print(f"{key:>22}: {value}")
    for err in stats["errors"][:10]:
        print("  error:", err)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({**result, "error_samples": stats["errors"][:50], "timeline": stats["timeline"]}, f, indent=1)
    if args.plot:
        _plot(stats["timeline"], args.plot)
    return 0 if not stats["errors"] and pools_full else 1


def _plot(timeline: list, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [x[0] for x in timeline]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.plot(t, [x[1] for x in timeline], color="tab:blue")
    ax.set_xlabel("seconds")
    ax.set_ylabel("RSS (MiB)", color="tab:blue")
    ax2 = ax.twinx()
    ax2.plot(t, [x[2] for x in timeline], color="tab:orange")
    ax2.set_ylabel("completed requests", color="tab:orange")
    ax.set_title("tpserve bench soak")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
