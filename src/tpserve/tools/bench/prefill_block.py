"""`tpserve bench prefill-block`: does a long prefill freeze the other streams?

For each server (--url, and --url2 to compare, e.g. two --max-num-batched-tokens settings):
start --streams streaming requests, wait until each has produced tokens, then send one long
prompt (--long-tokens random token ids, salted so no cache helps) and, while it prefills,
--short short requests (one every --short-interval seconds). Reported: the largest gap between
tokens of the running streams while the long prompt is in flight (against their gap before it),
the short requests' TTFT, and the long prompt's own TTFT.
"""

from __future__ import annotations

import asyncio
import json
import random
import time

from tpserve.tools.client import Client, ToolError, emit_json, friendly


def register(sub, bench, tune) -> None:
    p = bench.add_parser("prefill-block", help="stalls of running streams while a long prompt prefills")
    p.add_argument("--url", required=True, help="the server (base URL)")
    p.add_argument("--url2", default=None, help="a second server to compare with")
    p.add_argument("--api-key", default=None, help="bearer token (default: $OPENAI_API_KEY)")
    p.add_argument("--model", dest="served_model", default=None, help="model name (default: the first listed)")
    p.add_argument("--long-tokens", type=int, default=32768, help="the long prompt (capped by max_model_len)")
    p.add_argument("--streams", type=int, default=4, help="streams running while it prefills")
    p.add_argument("--short", type=int, default=4, help="short requests sent while it prefills")
    p.add_argument("--short-interval", type=float, default=0.05, help="seconds between short requests")
    p.add_argument("--stream-tokens", type=int, default=2000, help="max_tokens of the running streams")
    p.add_argument("--json", dest="json_out", default=None, help="write the results as JSON here ('-': stdout)")
    p.set_defaults(func=run)


async def _stream(client, url, body, stamps: list, stop: asyncio.Event | None = None) -> str | None:
    """Stream a completion, appending a timestamp per token event; returns an error or None."""
    try:
        async with client.stream("POST", url + "/v1/completions", json=dict(body, stream=True)) as r:
            if r.status_code != 200:
                return f"HTTP {r.status_code}: {(await r.aread())[:120]!r}"
            async for line in r.aiter_lines():
                if not line.startswith("data:") or line.strip() == "data: [DONE]":
                    continue
                try:
                    chunk = json.loads(line[5:])
                except ValueError:
                    return f"broken SSE event {line[:60]!r}"
                if "error" in chunk:
                    return f"error event: {chunk['error'].get('message')}"
                choices = chunk.get("choices") or []
                # a token whose text is still empty (a partial UTF-8 character) shows up at the latest
                # in the chunk that finishes the stream
                if any(c.get("text") for c in choices) or (not stamps and any(c.get("finish_reason") for c in choices)):
                    stamps.append(time.perf_counter())
                if stop is not None and stop.is_set():
                    return None
    except Exception as exc:  # noqa: BLE001 - reported
        return f"{type(exc).__name__}: {exc}"
    return None


def _ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(3, 250) for _ in range(n)]


async def measure(c: Client, args) -> dict:
    import httpx

    model = c.model
    long_len = args.long_tokens
    if c.max_model_len:
        long_len = min(long_len, c.max_model_len - 8)
    if long_len < 2:
        raise ToolError(f"--long-tokens {args.long_tokens} leaves no room (max_model_len {c.max_model_len})")
    rng = random.Random(time.time_ns())
    stop = asyncio.Event()
    base = {"model": model, "temperature": 0, "ignore_eos": True}
    async with httpx.AsyncClient(timeout=900, headers=c.headers) as client:
        stamps = [[] for _ in range(args.streams)]
        streams = [asyncio.ensure_future(_stream(client, c.url, dict(base, prompt=_ids(rng, 16),
                                                                     max_tokens=args.stream_tokens), s, stop))
                   for s in stamps]
        deadline = time.perf_counter() + 300
        while any(len(s) < 4 for s in stamps):
            if time.perf_counter() > deadline or any(t.done() for t in streams):
                stop.set()
                errs = [t.result() for t in streams if t.done() and t.result()]
                raise ToolError(f"{c.url}: the running streams did not start ({errs[:1] or 'timeout'})")
            await asyncio.sleep(0.01)
        before = [b - a for s in stamps for a, b in zip(s[-4:], s[-3:])]
        long_stamps: list[float] = []
        t0 = time.perf_counter()
        long_task = asyncio.ensure_future(_stream(client, c.url, dict(base, prompt=_ids(rng, long_len), max_tokens=1),
                                                  long_stamps))
        shorts = []
        for k in range(args.short):
            await asyncio.sleep(args.short_interval)
            if long_task.done():
                break
            st: list[float] = []
            shorts.append((time.perf_counter(), st, asyncio.ensure_future(
                _stream(client, c.url, dict(base, prompt=_ids(rng, 8), max_tokens=1), st))))
        long_err = await long_task
        t1 = long_stamps[0] if long_stamps else time.perf_counter()
        short_errs = [await task for _, _, task in shorts]
        await asyncio.sleep(0.2)  # let the streams show their next token after the prefill
        stop.set()
        stream_errs = await asyncio.gather(*streams)
    errors = [e for e in [long_err, *short_errs, *stream_errs] if e]
    gaps = []  # gaps overlapping the long request's time in flight
    for s in stamps:
        for a, b in zip(s, s[1:]):
            if b > t0 and a < t1:
                gaps.append(b - a)
    short_ttft = [st[0] - start for start, st, _ in shorts if st]
    return {"url": c.url, "model": model, "long_tokens": long_len, "long_ttft_s": t1 - t0,
            "streams": args.streams, "gap_before_ms": 1000 * (sorted(before)[len(before) // 2] if before else 0),
            "max_gap_during_ms": 1000 * max(gaps, default=0.0), "short_requests": len(shorts),
            "short_ttft_ms": [1000 * x for x in short_ttft],
            "short_ttft_max_ms": 1000 * max(short_ttft, default=0.0), "errors": errors}


@friendly
def run(args) -> int:
    from tqdm import tqdm

    if args.streams < 1 or args.short < 0:
        raise ToolError("--streams must be at least 1 and --short non-negative")
    urls = [args.url] + ([args.url2] if args.url2 else [])
    results = []
    for u in tqdm(urls, desc="prefill-block", unit="server", leave=False):
        c = Client(u, args.api_key, args.served_model)
        try:
            _ = c.model
            results.append(asyncio.run(measure(c, args)))
        finally:
            c.close()
    if args.json_out != "-":
        print("| server | long prompt | its TTFT s | stream gap before ms | largest gap during ms "
              "| short TTFT max ms | errors |")
        print("|" + " --- |" * 7)
        for r in results:
            print(f"| {r['url']} | {r['long_tokens']} | {r['long_ttft_s']:.2f} | {r['gap_before_ms']:.1f} | "
                  f"{r['max_gap_during_ms']:.1f} | {r['short_ttft_max_ms']:.1f} | {len(r['errors'])} |")
        for r in results:
            for e in r["errors"][:3]:
                print(f"ERROR {r['url']}: {e}")
    emit_json(args.json_out, {"results": results})
    return 1 if any(r["errors"] for r in results) else 0
