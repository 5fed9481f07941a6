"""The load generator of `tpserve bench serve`: streaming /v1/completions requests at a fixed
concurrency, optionally arriving as a Poisson process, each checked (status, a well-formed SSE
stream ending in [DONE], the token count asked for, and in cold-prefill mode, where every request
carries its own cache_salt, cached_tokens == 0).

Metrics per request, as in `vllm bench serve`: TTFT (first token), TPOT ((E2E - TTFT) /
(output tokens - 1)), ITL (gaps between streamed token events), E2E latency.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid

from tpserve.tools.sse import SseError, sse_event


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    k = (len(s) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


async def one_request(client, url: str, model: str, prompt, max_tokens: int, cold: bool,
                      extra: dict | None = None) -> dict:
    """One streamed completion, checked; `extra`: more body fields (cache_salt). -> its metrics and text."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": True, "ignore_eos": True,
            "temperature": 0, "stream_options": {"include_usage": True}, **(extra or {})}
    start = time.perf_counter()
    stamps, usage, error, done, texts = [], None, None, False, []
    try:
        async with client.stream("POST", url + "/v1/completions", json=body) as r:
            if r.status_code != 200:
                text = (await r.aread()).decode(errors="replace")
                return {"error": f"HTTP {r.status_code}: {text[:160]}", "latency": time.perf_counter() - start,
                        "start": start}
            async for line in r.aiter_lines():
                try:
                    kind, chunk = sse_event(line, done)
                except SseError as exc:
                    error = str(exc)
                    break
                if kind == "done":
                    done = True
                if kind != "chunk":
                    continue
                if "error" in chunk:
                    error = f"error event: {chunk['error'].get('message')}"
                    break
                if chunk.get("usage"):
                    usage = chunk["usage"]
                if any(c.get("text") for c in chunk.get("choices") or []):
                    stamps.append(time.perf_counter())
                    texts.extend(c.get("text") or "" for c in chunk["choices"])
    except Exception as exc:  # noqa: BLE001 - counted and reported
        error = f"{type(exc).__name__}: {exc}"
    end = time.perf_counter()
    if error is None and not done:
        error = "stream ended without data: [DONE]"
    n_out = (usage or {}).get("completion_tokens")
    if error is None and usage is None:
        error = "no usage in the stream (stream_options.include_usage)"
    elif error is None and n_out != max_tokens:
        error = f"returned {n_out} tokens, asked for {max_tokens} (ignore_eos)"
    cached = ((usage or {}).get("prompt_tokens_details") or {}).get("cached_tokens")
    res = {"error": error, "start": start, "latency": end - start, "ttft": stamps[0] - start if stamps else None,
           "itl": [b - a for a, b in zip(stamps, stamps[1:])], "output_tokens": n_out or 0,
           "prompt_tokens": (usage or {}).get("prompt_tokens", 0), "cached_tokens": cached, "text": "".join(texts)}
    if res["ttft"] is not None and n_out and n_out > 1:
        res["tpot"] = (res["latency"] - res["ttft"]) / (n_out - 1)
    if cold and error is None and cached != 0:
        res["cold_violation"] = "cached_tokens missing" if cached is None else f"cached_tokens={cached}"
    return res


async def run_level(url: str, model: str, prompts: list, *, concurrency: int, max_tokens: int, cold: bool,
                    request_rate: float = float("inf"), seed: int = 0, headers: dict | None = None,
                    desc: str = "requests") -> dict:
    """One benchmark level: all `prompts`, at most `concurrency` in flight, arrivals Poisson at
    `request_rate` per second (inf: all at once)."""
    import httpx
    from tqdm import tqdm

    sem = asyncio.Semaphore(concurrency)
    rng = random.Random(seed)
    limits = httpx.Limits(max_connections=concurrency + 8, max_keepalive_connections=concurrency + 8)
    async with httpx.AsyncClient(timeout=600, limits=limits, headers=headers or {}) as client:
        bar = tqdm(total=len(prompts), desc=desc, unit="req", leave=False)

        async def guarded(prompt, i):
            async with sem:
                extra = {"cache_salt": f"cold-{run}-{i}"} if cold else None  # no cache shares across requests
                res = await one_request(client, url, model, prompt, max_tokens, cold, extra)
                bar.update(1)
                return res

        start = time.perf_counter()
        tasks, run = [], uuid.uuid4().hex[:12]
        for i, prompt in enumerate(prompts):
            tasks.append(asyncio.ensure_future(guarded(prompt, i)))
            if request_rate != float("inf"):
                await asyncio.sleep(rng.expovariate(request_rate))
        results = await asyncio.gather(*tasks)
        duration = time.perf_counter() - start
        bar.close()
    return summarize(results, duration, concurrency=concurrency, max_tokens=max_tokens, cold=cold,
                     request_rate=request_rate)


def summarize(results: list[dict], duration: float, **setting) -> dict:
    ok = [r for r in results if not r["error"]]
    pct = lambda xs, scale=1000.0: {f"p{q}": scale * percentile(xs, q) for q in (50, 90, 99)}  # noqa: E731
    ttft = [r["ttft"] for r in ok if r["ttft"] is not None]
    out_tokens = sum(r["output_tokens"] for r in ok)
    violations = [r["cold_violation"] for r in ok if r.get("cold_violation")]
    res = {**setting, "request_rate": setting.get("request_rate") if setting.get("request_rate") != float("inf")
           else "inf", "requests": len(results), "completed": len(ok),
           "errors": [r["error"] for r in results if r["error"]], "duration_s": duration,
           "output_tok_per_s": out_tokens / duration if duration else 0.0,
           "input_tok_per_s": sum(r["prompt_tokens"] for r in ok) / duration if duration else 0.0,
           "requests_per_s": len(ok) / duration if duration else 0.0,
           "ttft_ms": pct(ttft), "tpot_ms": pct([r["tpot"] for r in ok if "tpot" in r]),
           "itl_ms": pct([x for r in ok for x in r["itl"]]), "e2e_ms": pct([r["latency"] for r in ok]),
           "cached_tokens_total": sum(r["cached_tokens"] or 0 for r in ok)}
    sent = [r for r in results if "start" in r]
    if sent:  # each request in the order sent: [sent, TTFT, E2E] in ms from the first sent (which wait, how long)
        t0 = min(r["start"] for r in sent)
        res["timeline_ms"] = sorted([round(1000 * (r["start"] - t0), 2),
                                     None if r.get("ttft") is None else round(1000 * r["ttft"], 2),
                                     round(1000 * r["latency"], 2)] for r in sent)
    if setting.get("cold"):
        res["cold_valid"] = not violations and len(ok) == len(results)
        res["cold_violations"] = violations[:5] + ([f"... {len(violations) - 5} more"] if len(violations) > 5 else [])
    return res
