"""Where the first token of a cached turn goes, in process: tokenizing the prompt, then the engine from add_request
to the first token, for a turn whose history is cached (warm) and for the same prompt under a fresh salt (cold).

    python bench/prefix_ttft.py MODEL [--load-format dummy] [--device cuda] [--prompt-len 5500] [--turn-len 87]
        [--repeats 3] [--profile 20] [--trace trace.json] [--sync-debug]
    python bench/prefix_ttft.py MODEL --tokenize-only

The prompts are `bench serve --dataset multiturn`'s: the first turn of --prompt-len words, answered, then a turn of
--turn-len words. Each repeat runs turn 1 under a new salt, then turn 2 under the same salt (warm) and under another
(cold). Prints the medians and warm/cold; --profile N adds one more warm turn under torch.profiler and prints its N
ops with the most self time on the device and on the host (--trace: its timeline as a Chrome trace, for
bench/trace_gaps.py); --sync-debug (CUDA) one more warm turn that counts
the host's waits on the device (torch's sync debug mode) by where they happen. --tokenize-only loads just the
tokenizer and times transformers' encode against tpserve's (engine/tokenizer.py) on the second turn's text.
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import time
import traceback
import uuid
import warnings

import torch

from tpserve import LLM
from tpserve.engine.tokenizer import encode
from tpserve.sampling_params import SamplingParams
from tpserve.tools.bench.multiturn import conversation_turns


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def first_token(engine, ids: list[int], salt: str, max_tokens: int, device: str) -> tuple[float, list[int], int]:
    """add_request to the first output token; the request then runs to its end. -> (s, tokens, cached)."""
    rid = uuid.uuid4().hex
    params = SamplingParams(max_tokens=max_tokens, temperature=0)
    _sync(device)
    t0 = time.perf_counter()
    engine.add_request(rid, ids, params, cache_salt=salt)
    ttft, out = None, None
    while out is None or not out.finished:
        for o in engine.step():
            if o.request_id == rid:
                out = o
                if ttft is None and o.outputs[0].token_ids:
                    ttft = time.perf_counter() - t0
    return ttft, list(out.outputs[0].token_ids), out.num_cached_tokens or 0


def turn_two(engine, tok, turns: tuple[str, str], max_tokens: int, device: str) -> tuple[str, list[int], float]:
    """Turn 1 run under a new salt, then turn 2's text (turn 1, its answer, the new turn) tokenized ->
    (the salt, turn 2's ids, seconds tokenizing them)."""
    first, second = turns
    salt = f"ttft-{uuid.uuid4().hex}"
    _, answer, _ = first_token(engine, encode(tok, first, add_special_tokens=False), salt, max_tokens, device)
    text = first + tok.decode(answer) + second
    t0 = time.perf_counter()
    ids = encode(tok, text, add_special_tokens=False)
    return salt, ids, time.perf_counter() - t0


def sync_sites(run) -> collections.Counter:
    """Where run()'s implicit host-device syncs happen: the innermost frames outside torch, by count."""
    sites: collections.Counter = collections.Counter()

    def hook(message, category, filename, lineno, file=None, line=None):
        frames = [f for f in traceback.extract_stack()[:-1] if "/torch/" not in f.filename
                  and not f.filename.endswith(("warnings.py", "prefix_ttft.py"))]
        sites[" < ".join(f"{f.filename.split('site-packages/')[-1]}:{f.lineno}" for f in frames[::-1][:3])] += 1

    with warnings.catch_warnings():  # (restores showwarning on the way out)
        warnings.simplefilter("always")
        warnings.showwarning = hook
        torch.cuda.set_sync_debug_mode("warn")
        try:
            run()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    return sites


def tokenize_only(args) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(args.model)
    first, second = conversation_turns(1, 2, args.prompt_len, args.turn_len, 0)[0]
    text = first + " an answer of a few words" + second
    times = {}
    for name, fn in (("transformers", lambda: tok.encode(text, add_special_tokens=False)),
                     ("tpserve", lambda: encode(tok, text, add_special_tokens=False))):
        fn()
        runs = []
        for _ in range(15):
            t0 = time.perf_counter()
            ids = fn()
            runs.append(time.perf_counter() - t0)
        times[name] = (statistics.median(runs) * 1e3, ids)
    same = times["transformers"][1] == times["tpserve"][1]
    print(f"{len(times['tpserve'][1])} tokens, {os.cpu_count()} cores: transformers' encode "
          f"{times['transformers'][0]:.1f} ms, tpserve's {times['tpserve'][0]:.1f} ms (median of 15); ids "
          f"{'identical' if same else 'DIFFER'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--load-format", default="auto")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--prompt-len", type=int, default=5500)
    ap.add_argument("--turn-len", type=int, default=87)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--profile", type=int, default=0)
    ap.add_argument("--trace", help="with --profile: write the profiled turn's Chrome trace here")
    ap.add_argument("--sync-debug", action="store_true")
    ap.add_argument("--tokenize-only", action="store_true")
    args = ap.parse_args()
    if args.tokenize_only:
        return tokenize_only(args)

    llm = LLM(args.model, device=args.device, load_format=args.load_format)
    engine, tok = llm.engine, llm.get_tokenizer()
    turns = tuple(conversation_turns(1, 2, args.prompt_len, args.turn_len, 0)[0])
    rows: dict[str, list[float]] = {"tokenize turn 2": [], "warm: add to first token": [],
                                    "cold: add to first token": []}
    cached = []
    for r in range(args.repeats + 1):  # the first round warms up
        salt, ids2, t_tok = turn_two(engine, tok, turns, args.max_tokens, args.device)
        warm, out_w, hit = first_token(engine, ids2, salt, args.max_tokens, args.device)
        cold, out_c, _ = first_token(engine, ids2, f"cold-{uuid.uuid4().hex}", args.max_tokens, args.device)
        if r:
            rows["tokenize turn 2"].append(t_tok)
            rows["warm: add to first token"].append(warm)
            rows["cold: add to first token"].append(cold)
            cached.append(hit)
        print(f"round {r}: turn 2 {len(ids2)} tokens, {hit} cached, outputs "
              f"{'identical' if out_w == out_c else 'DIFFER'}", flush=True)
    med = {k: statistics.median(v) * 1e3 for k, v in rows.items()}
    print(f"\n| part | ms (median of {args.repeats}) |\n| --- | --- |")
    for k, v in med.items():
        print(f"| {k} | {v:.1f} |")
    t = med["tokenize turn 2"]
    print(f"| warm/cold, engine only | {med['warm: add to first token'] / med['cold: add to first token']:.3f}x |")
    print(f"| warm/cold, with tokenizing | {(med['warm: add to first token'] + t) / (med['cold: add to first token'] + t):.3f}x |")
    print(f"cached tokens: {cached}")

    if args.sync_debug and args.device.startswith("cuda"):
        salt, ids2, _ = turn_two(engine, tok, turns, 1, args.device)
        sites = sync_sites(lambda: first_token(engine, ids2, salt, 1, args.device))
        print(f"\nwaits on the device in a warm turn: {sum(sites.values())}")
        for site, n in sites.most_common():
            print(f"{n:4d}  {site}")

    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        salt, ids2, _ = turn_two(engine, tok, turns, 1, args.device)
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device.startswith("cuda") else [])
        with profile(activities=acts, with_stack=bool(args.trace)) as prof:
            wall, _, hit = first_token(engine, ids2, salt, 1, args.device)
        key = "self_device_time_total" if args.device.startswith("cuda") else "self_cpu_time_total"
        print(f"\nprofiled warm turn: {wall * 1e3:.1f} ms wall (profiler on), {hit} cached")
        if args.trace:
            prof.export_chrome_trace(args.trace)
        print(prof.key_averages().table(sort_by=key, row_limit=args.profile, max_name_column_width=60))
        if key != "self_cpu_time_total":
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.profile,
                                            max_name_column_width=60))


if __name__ == "__main__":
    main()
