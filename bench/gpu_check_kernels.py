"""GPU check of the fused mHC kernel and the grouped-GEMM MoE kernels against their torch forms.

Correctness (max abs diff; for bf16 MoE also the error relative to the output's max) and time per
call (wall clock around call + synchronize, median of 30 after 3 warm-ups: both forms include their
launches and the loop's host sync, which is what a decode step pays). MoE at GLM-5.3-Flash's sizes
(288 experts, D 4096, top-8, bf16; I 2048 = TP=1, 1024 = one rank of TP=2), one layer of random
weights; floor = the larger of (bytes of the experts the batch touches / the card's HBM bandwidth) and
(FLOPs / its dense bf16 peak; bench/quant_kernels.card_figures).
Usage: python bench/gpu_check_kernels.py [--tokens 1,8,32,128,256,512] [--inter 2048,1024] [--reference]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from tpserve.kernels.moe import ref as moe
from tpserve.kernels.norms.mhc import hc_weights_torch
from tpserve.kernels.norms.mhc_triton import hc_weights_triton
from tpserve.kernels.moe.grouped_triton import experts_triton
from quant_kernels import card_figures  # bench/ (the script's directory)

HBM, BF16_FLOPS = card_figures()


def wall_ms(fn, reps: int = 30) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def check_mhc(dev) -> None:
    print("| mHC weights, T | max diff pre/post/comb | torch ms | triton ms | speedup |\n"
          "| --- | --- | --- | --- | --- |")
    n = 4
    for t in (1, 32, 4096):
        g = torch.Generator(device=dev).manual_seed(t)
        mixed = torch.randn(t, (2 + n) * n, generator=g, device=dev)
        base = torch.randn((2 + n) * n, generator=g, device=dev)
        scale = torch.rand(3, generator=g, device=dev) + 0.5
        want = hc_weights_torch(mixed, base, scale, n, 20, 1e-6)
        got = hc_weights_triton(mixed, base, scale, n, 20, 1e-6)
        diff = max((a - b).abs().max().item() for a, b in zip(got, want))
        a = wall_ms(lambda: hc_weights_torch(mixed, base, scale, n, 20, 1e-6))
        b = wall_ms(lambda: hc_weights_triton(mixed, base, scale, n, 20, 1e-6))
        print(f"| {t} | {diff:.2e} | {a:.3f} | {b:.3f} | {a / b:.1f}x |", flush=True)


def check_moe(dev, tokens: list[int], inter: int, reference: bool) -> None:
    e, d, k = 288, 4096, 8
    g = torch.Generator(device=dev).manual_seed(0)
    gate_up = (torch.randn(e, 2 * inter, d, generator=g, device=dev, dtype=torch.bfloat16) * d**-0.5)
    down = (torch.randn(e, d, inter, generator=g, device=dev, dtype=torch.bfloat16) * inter**-0.5)
    ref_w = (gate_up.float(), down.float()) if reference else None
    per_expert = 3 * inter * d * 2
    ref_cols = " | loop err vs fp32 | triton err vs fp32" if reference else ""
    print(f"\n| MoE I={inter}, T | experts used | max diff (rel. to max out){ref_cols} | torch loop ms | triton ms "
          "| speedup | floor ms | triton % of floor |\n| --- | --- | --- | " + "--- | " * (2 * reference)
          + "--- | --- | --- | --- | --- |")
    for t in tokens:
        x = torch.randn(t, d, generator=g, device=dev, dtype=torch.bfloat16)
        ids = torch.rand(t, e, generator=g, device=dev).topk(k, dim=-1)[1]
        weights = torch.rand(t, k, generator=g, device=dev)
        want = moe.experts_loop(x, weights, ids, gate_up, down, 10.0)
        got = experts_triton(x, weights, ids, gate_up, down, 10.0)
        diff = (got.float() - want.float()).abs().max().item()
        rel = diff / want.float().abs().max().item()
        errs = ""
        if reference:  # both bf16 forms against the same math in fp32 (max abs error / max |reference|)
            ref = moe.experts_loop(x.float(), weights, ids, *ref_w, 10.0)
            scale = ref.abs().max().item()
            errs = "".join(f" | {(y.float() - ref).abs().max().item() / scale:.1e}" for y in (want, got))
        used = int(torch.unique(ids).numel())
        a = wall_ms(lambda: moe.experts_loop(x, weights, ids, gate_up, down, 10.0))
        b = wall_ms(lambda: experts_triton(x, weights, ids, gate_up, down, 10.0))
        floor = 1000 * max(used * per_expert / HBM, 2 * t * k * 3 * inter * d / BF16_FLOPS)
        print(f"| {t} | {used} | {diff:.2e} ({rel:.1e}){errs} | {a:.3f} | {b:.3f} | {a / b:.2f}x | {floor:.3f} | "
              f"{100 * floor / b:.0f}% |", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", default="1,8,32,128,256,512")
    ap.add_argument("--inter", default="2048,1024", help="expert widths per rank (2048: TP=1, 1024: TP=2)")
    ap.add_argument("--reference", action="store_true", help="also each form's error against fp32 math")
    ap.add_argument("--skip-mhc", action="store_true")
    args = ap.parse_args()
    dev = torch.device("cuda")
    if not args.skip_mhc:
        check_mhc(dev)
    tokens = [int(x) for x in args.tokens.split(",")]
    for inter in args.inter.split(","):
        check_moe(dev, tokens, int(inter), args.reference)
        torch.cuda.empty_cache()  # the layer's weights are gone with the call
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
