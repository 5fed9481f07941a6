"""A rolling restart of a running fleet (`tpserve serve -dp N`) under continuous load: failed requests, and how
long each replica was out of rotation (from leaving the router to serving again: drain, restart, snapshot restore,
warm-up).

    python bench/rolling_restart.py --url http://127.0.0.1:8000 [--admin URL] [--api-key K] [--concurrency 8]
        [--max-tokens 16] [--json F]

--admin defaults to the port after --url's (serve's --admin-port default). It waits for every replica to serve,
then starts the load: --concurrency clients sending completions one after another (every other one streamed) until
the restart is done. A request fails on a status other than 200 or a stream without its [DONE].
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from urllib.parse import urlsplit, urlunsplit

import httpx


def load(url: str, headers: dict, model: str, max_tokens: int, i: int, stop: threading.Event, out: list) -> None:
    n = 0
    with httpx.Client(timeout=600) as client:
        while not stop.is_set():
            n += 1
            body = {"model": model, "prompt": f"client {i} request {n}: tell me about the sea",
                    "max_tokens": max_tokens, "stream": i % 2 == 1}
            try:
                r = client.post(url + "/v1/completions", headers=headers, json=body)
                whole = not body["stream"] or r.text.rstrip().endswith("data: [DONE]")
                out.append((r.status_code == 200 and whole, r.status_code, "" if whole else "stream cut"))
            except httpx.HTTPError as exc:
                out.append((False, -1, repr(exc)))


def replicas(admin: str, headers: dict) -> list[dict]:
    try:
        return httpx.get(admin + "/admin/replicas", headers=headers).json()["replicas"] or [{"state": "none"}]
    except httpx.HTTPError:
        return [{"state": "unreachable"}]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True)
    ap.add_argument("--admin")
    ap.add_argument("--api-key")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--wait", type=float, default=900, help="seconds to wait for every replica to serve first")
    ap.add_argument("--json", dest="json_out")
    args = ap.parse_args()
    parts = urlsplit(args.url)
    admin = args.admin or urlunsplit(parts._replace(netloc=f"{parts.hostname}:{parts.port + 1}"))
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    deadline = time.monotonic() + args.wait
    while not all(r["state"] == "serving" for r in replicas(admin, headers)):
        if time.monotonic() > deadline:
            raise SystemExit(f"the replicas were not all serving after {args.wait} s")
        time.sleep(1.0)
    model = httpx.get(args.url + "/v1/models", headers=headers).json()["data"][0]["id"]
    stop, results = threading.Event(), []
    clients = [threading.Thread(target=load, args=(args.url, headers, model, args.max_tokens, i, stop, results))
               for i in range(args.concurrency)]
    for t in clients:
        t.start()
    time.sleep(2.0)
    r = httpx.post(admin + "/admin/rolling_restart", headers=headers)
    if r.status_code != 202:
        raise SystemExit(f"POST /admin/rolling_restart: {r.status_code} {r.text}")
    t0, out_since, out_of_rotation = time.monotonic(), {}, {}
    while True:
        status = httpx.get(admin + "/admin/replicas", headers=headers).json()
        now = time.monotonic()
        for rep in status["replicas"]:
            name = rep["replica"]
            if rep["state"] != "serving":
                out_since.setdefault(name, now)
            elif name in out_since and name not in out_of_rotation:
                out_of_rotation[name] = now - out_since[name]
        if not status["rolling_restart"]["running"]:
            break
        time.sleep(0.25)
    total = time.monotonic() - t0
    stop.set()
    for t in clients:
        t.join()
    failed = [r for r in results if not r[0]]
    roll = status["rolling_restart"]
    report = {"requests": len(results), "failed": len(failed), "failures": failed[:10], "restart_s": round(total, 1),
              "restarted": roll["restarted"], "error": roll["error"],
              "out_of_rotation_s": {k: round(v, 1) for k, v in sorted(out_of_rotation.items())}}
    print(f"rolling restart: {len(roll['restarted'])} replicas in {total:.1f} s (error: {roll['error']}); "
          f"requests {len(results)}, failed {len(failed)}")
    for name, s in sorted(out_of_rotation.items()):
        print(f"  replica {name}: out of rotation {s:.1f} s")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
