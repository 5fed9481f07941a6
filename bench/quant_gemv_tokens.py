"""Greedy tokens and decode speed of the built-in model quantized to FP8 (`tpserve quantize --method fp8`) under
--quant-gemv-backend cuda and triton on a GPU, against the same checkpoint in float32 on the CPU.

    python bench/quant_gemv_tokens.py [--batch 8] [--max-tokens 64] [--rounds 3] [--json F]

The FP8 checkpoint's linears with at least 128 outputs are FP8 block-128 (K 256 / 512 here), so decode steps of
1-8 sequences run the W8A16 GEMV; the two backends differ only there. Prints, per backend, how many of the prompts
decode exactly the CPU's tokens and the decode tok/s of a batch (median of --rounds).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from spec_ab import timed_pass  # noqa: E402

from tpserve import LLM, SamplingParams  # noqa: E402
from tpserve.engine.setup import builtin_demo_model  # noqa: E402
from tpserve.tools.quantize import quantize_checkpoint  # noqa: E402
from tpserve.tools.acceptance import mtp_prompts  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    prompts = (mtp_prompts() * args.batch)[:args.batch]
    sp = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    result = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = quantize_checkpoint(builtin_demo_model(), Path(tmp) / "fp8", "fp8")
        cpu = LLM(model=str(path), device="cpu", dtype="float32", max_num_seqs=args.batch)
        ref = [r.outputs[0].token_ids for r in cpu.generate(prompts, sp)]
        cpu.shutdown()
        for backend in ("triton", "cuda"):
            llm = LLM(model=str(path), device="cuda", max_num_seqs=args.batch, kv_cache_memory=2**30,
                      quant_gemv_backend=backend)
            got = [r.outputs[0].token_ids for r in llm.generate(prompts, sp)]
            rates = [timed_pass(llm, [prompts], sp) for _ in range(args.rounds)]
            llm.shutdown()
            same = sum(a == b for a, b in zip(got, ref))
            result[backend] = dict(same_as_cpu=same, prompts=len(prompts), tok_s=statistics.median(rates),
                                   tokens=got)
            print(f"{backend}: {same}/{len(prompts)} prompts decode the CPU float32 tokens; decode "
                  f"{statistics.median(rates):.1f} tok/s at batch {args.batch} (rounds {[round(r) for r in rates]})",
                  flush=True)
    same = sum(a == b for a, b in zip(result["cuda"]["tokens"], result["triton"]["tokens"]))
    result["cuda == triton"] = same
    print(f"cuda against triton: {same}/{len(prompts)} prompts the same tokens", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
