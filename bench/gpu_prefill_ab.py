"""Sparse vs dense MLA prefill, A/B in one process on real-width layers (one device call).

Builds the real-width KKKM model once (bf16, random weights, decode graphs on), then for each
--mla-prefill mode (flipped on the MLA layers between runs, so both use the same weights and
cache): prefill time at 4k and 16k tokens (median of 3 after a warm-up), and the logits of the
last 32 positions of a 16k-token prompt, compared between the modes (max |diff| / max |logit|).
Then a torch-profiler table of decode steps at batch 1 (per-kernel device time).
Usage: python bench/gpu_prefill_ab.py [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from tpserve import LLM, SamplingParams
from tpserve.engine.runner import StepPlan
from tpserve.model.mla import MlaAttention
from tpserve.tools.bench_model import profile_decode, real_width_config


def prefill_time(engine, prompt: list[int]) -> float:
    engine.add_request(f"p{time.monotonic_ns()}", prompt, SamplingParams(temperature=0, max_tokens=1,
                                                                          ignore_eos=True))
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    engine.step()
    took = time.perf_counter() - start
    while engine.has_unfinished():
        engine.step()
    return took


def last_logits(engine, prompt: list[int], rows: int = 32) -> torch.Tensor:
    bs = engine.executor.cache_shape.block_size
    blocks = engine.block_pool.allocate(-(-len(prompt) // bs))
    slot = engine.slot_pool.allocate(1)
    try:
        n = len(prompt)
        plan = StepPlan(list(prompt), list(range(n)), [0, n], [0], slot, [blocks], list(range(n - rows, n)),
                        list(slot))
        return engine.executor.execute(plan).float().cpu()
    finally:
        engine.block_pool.free(blocks)
        engine.slot_pool.free(slot)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    ap.add_argument("--lengths", type=int, nargs="*", default=[4096, 16384])
    ap.add_argument("--device", default="cuda", help="cpu with --size tiny: a smoke test of this script")
    ap.add_argument("--size", choices=("real", "tiny"), default="real")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "config.json").write_text(json.dumps(real_width_config("KKKM", False, args.size)))
        llm = LLM(tmp, device=args.device, dtype="bfloat16", load_format="dummy", skip_tokenizer_init=True,
                  max_num_batched_tokens=max(args.lengths), max_num_seqs=8,
                  kv_cache_memory=8 * 2**30 if args.size == "real" else 64 * 2**20)
        engine = llm.engine
        mla = [m for m in engine.executor.runner.model.modules() if isinstance(m, MlaAttention)]
        gen = torch.Generator().manual_seed(0)
        vocab = engine.model_config.vocab_size
        prompts = {n: torch.randint(0, vocab, (n,), generator=gen).tolist() for n in args.lengths}
        out = {"modes": {}}
        logits = {}
        for mode in ("dense", "sparse"):
            for m in mla:
                m.prefill_mode = mode
            res = {}
            for n, prompt in prompts.items():
                prefill_time(engine, prompt)  # warm-up (autotuning, allocator)
                times = [prefill_time(engine, prompt) for _ in range(3)]
                res[n] = {"ms": 1000 * statistics.median(times), "all_ms": [1000 * t for t in times]}
            logits[mode] = last_logits(engine, prompts[max(args.lengths)])
            out["modes"][mode] = res
        diff = (logits["sparse"] - logits["dense"]).abs().max().item()
        scale = logits["dense"].abs().max().item()
        argmax_equal = (logits["sparse"].argmax(-1) == logits["dense"].argmax(-1)).float().mean().item()
        out["logits"] = {"max_abs_diff": diff, "max_abs_logit": scale, "argmax_equal_frac": argmax_equal}
        print("| prefill tokens | dense ms | sparse ms | sparse / dense |\n| --- | --- | --- | --- |")
        for n in args.lengths:
            d, s = out["modes"]["dense"][n]["ms"], out["modes"]["sparse"][n]["ms"]
            print(f"| {n} | {d:.1f} | {s:.1f} | {s / d:.3f} |")
        print(f"last 32 positions of the {max(args.lengths)}-token prompt: max |sparse - dense| = {diff:.3e} "
              f"(max |logit| {scale:.2f}), argmax equal at {100 * argmax_equal:.0f}% of positions")
        for m in mla:
            m.prefill_mode = "dense"
        out["profile"] = profile_decode(llm, 1, 8)
        llm.shutdown()
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
