"""transformers 5.23.0 baseline for `tpserve bench model` (same layers, random bf16 weights).

Times a prefill of each length and batch-1 decode steps with the HF cache. Usage:
    python bench/hf_baseline.py --prefill 1024 4096 --decode-steps 16
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def main() -> int:
    from transformers import Glm5NextConfig, Glm5NextForConditionalGeneration

    from tpserve.model.tiny import TINY_VISION
    from tpserve.tools.bench.model import real_width_config

    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", default="KKKM")
    ap.add_argument("--prefill", type=int, nargs="*", default=[1024, 4096])
    ap.add_argument("--decode-steps", type=int, default=16)
    args = ap.parse_args()
    text = real_width_config(args.layers, dense_first=False)["text_config"]
    cfg = Glm5NextConfig(text_config=text, vision_config=dict(TINY_VISION))
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = Glm5NextForConditionalGeneration(cfg).eval()
    torch.set_default_dtype(torch.float32)
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    with torch.no_grad():
        model(input_ids=torch.randint(0, 1000, (1, 128), device="cuda", generator=gen))  # warm-up
        for n in args.prefill:
            ids = torch.randint(0, 150000, (1, n), device="cuda", generator=gen)
            torch.cuda.synchronize()
            t = time.perf_counter()
            model(input_ids=ids)
            torch.cuda.synchronize()
            dt = time.perf_counter() - t
            rows.append((f"prefill {n} tokens", f"{1000 * dt:.1f} ms", f"{n / dt:.0f} tok/s"))
        out = model(input_ids=torch.randint(0, 150000, (1, 128), device="cuda", generator=gen), use_cache=True)
        cache, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
        times = []
        for _ in range(args.decode_steps):
            torch.cuda.synchronize()
            t = time.perf_counter()
            out = model(input_ids=tok, past_key_values=cache, use_cache=True)
            tok = out.logits[:, -1:].argmax(-1)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t)
            cache = out.past_key_values
        med = statistics.median(times[2:])
        rows.append(("decode step, batch 1", f"{1000 * med:.2f} ms", f"{1 / med:.1f} tok/s"))
    print(f"transformers baseline, layers {args.layers}, MoE in every layer, bf16")
    print("| what | time | rate |\n| --- | --- | --- |")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
