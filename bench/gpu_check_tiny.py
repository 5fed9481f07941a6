"""CUDA correctness on the tiny checkpoints (one device call; prints a table).

(a) greedy tokens in float32 on CUDA (fla-core KDA, and the torch KDA path) equal the CPU ones,
    and prefill logits within tolerance of the CPU path;
(b) TP=2 over NCCL (with and without sequence parallelism) equals TP=1 on CUDA.
Usage: python bench/gpu_check_tiny.py [--tp] [--custom-allreduce]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from helpers import TINY_CONFIGS, make_checkpoint, prefill_logits, random_prompts  # noqa: E402

from tpserve import LLM, SamplingParams  # noqa: E402

PARAMS = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)


def tokens(llm, prompts):
    return [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in prompts], PARAMS)]


def run_case(label, make, prompts, reference, ref_logits, rows):
    try:
        llm = make()
        try:
            got = tokens(llm, prompts)
            diff = (prefill_logits(llm, prompts[1]) - ref_logits).abs().max().item()
        finally:
            llm.shutdown()
        same = sum(a == b for a, b in zip(got, reference))
        rows.append((label, f"{same}/{len(prompts)}", f"{diff:.2e}"))
    except Exception as exc:  # keep going: one broken path must not hide the others
        traceback.print_exc()
        rows.append((label, "ERROR", f"{type(exc).__name__}: {str(exc)[:80]}"))
    print(f"| {rows[-1][0]} | {rows[-1][1]} | {rows[-1][2]} |", flush=True)


def main() -> int:
    import logging
    import os

    logging.basicConfig(level=os.environ.get("TPSERVE_LOG_LEVEL", "WARNING"))
    ap = argparse.ArgumentParser()
    ap.add_argument("--tp", action="store_true", help="also check TP=2 over NCCL")
    ap.add_argument("--custom-allreduce", action="store_true")
    ap.add_argument("--configs", default=",".join(TINY_CONFIGS), help="comma list of tiny configs")
    args = ap.parse_args()
    rows = []
    common = dict(kv_cache_memory="64MiB", block_size=16, max_num_batched_tokens=64)
    print("| case | greedy sequences equal | max |logit diff| (prefill) |\n| --- | --- | --- |", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.configs.split(","):
            full = name == "default"  # every variant on one config, the main ones on the others
            path = str(make_checkpoint(Path(tmp), name))
            prompts = random_prompts((9, 120, 40, 77), seed=3)
            cpu = LLM(path, device="cpu", dtype="float32", **common)
            reference = tokens(cpu, prompts)
            ref_logits = prefill_logits(cpu, prompts[1])
            for backend in ("fla",):
                run_case(f"{name}: cuda fp32 kda={backend} vs cpu", lambda b=backend: LLM(
                    path, device="cuda", dtype="float32", kda_backend=b, **common), prompts, reference, ref_logits,
                    rows)
            if args.tp:
                for ar in (args.custom_allreduce,):
                    run_case(f"{name}: cuda fp32 TP=2 NCCL+SP custom_allreduce={ar} vs cpu", lambda a=ar: LLM(
                        path, device="cuda", dtype="float32", tensor_parallel_size=2, sequence_parallel=True,
                        sp_min_tokens=16, custom_allreduce=a, **common), prompts, reference, ref_logits, rows)
            if full and len(args.configs.split(",")) > 1:
                run_case(f"{name}: cuda bf16 kda=fla vs cpu fp32 (tolerance)", lambda: LLM(
                    path, device="cuda", dtype="bfloat16", **common), prompts, reference, ref_logits, rows)
    print("\n| case | greedy sequences equal | max |logit diff| (prefill) |\n| --- | --- | --- |")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
