"""The first requests after ready against the later ones, with the routes' warm-up (server/route_warmup.py) and without:
each start a fresh `tpserve serve --warmup` process, then streamed completions one at a time.

    python bench/first_request.py [--device cpu] [--model DIR] [--starts 3] [--requests 6] [--route completions|chat]

Prints per setting the median over starts of the first request's TTFT, of the later requests' median TTFT, and of
the difference (what the first client waits for the HTTP layer's first-use work).
"""

from __future__ import annotations

import argparse
import statistics
import time
from types import SimpleNamespace

import httpx

from tpserve.tools.bench.server_process import ServerProcess


def one_start(args, warm_routes: bool) -> list[float]:
    server = ServerProcess(SimpleNamespace(model=args.model, device=args.device, warmup=True,
                                           warmup_routes=warm_routes, log_level="warning"), args.boot_timeout)
    try:
        model = httpx.get(server.url + "/v1/models").json()["data"][0]["id"]
        return [ttft(server.url, model, args.route, i) for i in range(args.requests)]
    finally:
        server.close()


def ttft(url: str, model: str, route: str, i: int) -> float:
    body = ({"prompt": f"Count: {i} {i + 1}"} if route == "completions" else
            {"messages": [{"role": "user", "content": f"Count to {i + 2}."}]})
    t0 = time.perf_counter()
    with httpx.stream("POST", f"{url}/v1/{route.replace('chat', 'chat/completions')}", timeout=120,
                      json={"model": model, "max_tokens": 4, "temperature": 0, "stream": True, **body}) as r:
        if r.status_code != 200:
            raise SystemExit(f"{route}: {r.status_code} {r.read()[:300]!r}")
        lines = r.iter_lines()
        for line in lines:
            if line.startswith("data:"):
                first = (time.perf_counter() - t0) * 1e3
                break
        for _ in lines:
            pass
    return first


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--model", default=None, help="checkpoint directory (default: the built-in demo model)")
    ap.add_argument("--starts", type=int, default=3)
    ap.add_argument("--requests", type=int, default=6)
    ap.add_argument("--route", choices=("completions", "chat"), default="completions")
    ap.add_argument("--boot-timeout", type=float, default=900)
    args = ap.parse_args()
    rows = {True: [], False: []}
    for _ in range(args.starts):
        for warm in (False, True):  # alternated: drift of the machine falls on both
            times = one_start(args, warm)
            rows[warm].append((times[0], statistics.median(times[1:])))
    print(f"{args.route} on {args.device}, {args.starts} starts x {args.requests} requests (median over starts)")
    print("| routes' warm-up | first request TTFT ms | later requests TTFT ms | first - later ms |")
    print("| --- | --- | --- | --- |")
    for warm in (False, True):
        first, later = (statistics.median(r[k] for r in rows[warm]) for k in (0, 1))
        diff = statistics.median(a - b for a, b in rows[warm])
        print(f"| {'on' if warm else 'off'} | {first:.1f} | {later:.1f} | {diff:.1f} |")


if __name__ == "__main__":
    main()
