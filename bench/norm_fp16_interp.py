"""The fused norms in 16-bit against float32, on the CPU through Triton's interpreter (no GPU needed).

    PYTHONPATH=<triton>:<numpy 2.2> TRITON_INTERPRET=1 python bench/norm_fp16_interp.py [--configs default,...]

The random tiny checkpoints are chaotic in 16-bit, so the fused norms cannot give the torch forms'
16-bit tokens; the stated tolerance is that they move the model no further from float32 than the torch
forms do. For each tiny config: prefill logits of a 40-token prompt in float32 (torch forms: the
reference), then float16 with the torch forms and float16 with the fused kernels (set_norm_backend on
the loaded model); prints each one's max logit difference from the reference and whether the argmax
agrees at every position. float16, not bfloat16: the interpreter truncates float32 -> bfloat16.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from helpers import TINY_CONFIGS, make_checkpoint, prefill_logits, random_prompts  # noqa: E402

from tpserve import LLM  # noqa: E402
from tpserve.model.layers import set_norm_backend  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", default=",".join(TINY_CONFIGS))
    args = ap.parse_args()
    print("| config | case | max logit diff vs float32 torch | argmax equal to float32 | max abs logit |\n"
          "| --- | --- | --- | --- | --- |", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.configs.split(","):
            path = str(make_checkpoint(Path(tmp), name))
            prompt = random_prompts((40,), seed=3)[0]
            ref = None
            for dtype, backend in (("float32", "torch"), ("float16", "torch"), ("float16", "triton")):
                llm = LLM(path, device="cpu", dtype=dtype, kv_cache_memory="64MiB", block_size=16)
                set_norm_backend(llm.engine.executor.runner.model, backend)
                got = prefill_logits(llm, prompt).float()
                llm.shutdown()
                if ref is None:
                    ref = got
                    continue
                same = (got.argmax(-1) == ref.argmax(-1)).float().mean().item()
                print(f"| {name} | {dtype} norm {backend} | {(got - ref).abs().max().item():.3e} | {same:.0%} | "
                      f"{ref.abs().max().item():.2e} |", flush=True)


if __name__ == "__main__":
    main()
