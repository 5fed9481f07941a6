"""The Triton decode GEMV (kernels/gemv_triton.py) against cuBLAS on the dense linears of a real-width model.

    PYTHONPATH=src python bench/gemv_kernels.py [--layers KKKM] [--m 1 4 8 16] [--json F]

Shapes: every Linear of the real-width model (bench model's config for --layers) with at least
kernels/gemv_triton.MIN_N outputs, deduplicated, with how many such layers the model has. For each
shape and M: correctness of both against a float64 product of the same bf16 inputs (max error over
the output's magnitude), then time per call from CUDA-graph replays of 20 calls (median of 5; quant_kernels.timed), each
call on another copy of the weight so that the copies (>= 256 MB) cannot sit in L2 (50 MB); the floor
is the weight's bytes / the card's HBM bandwidth. Prints a table and the per-step sum over the model's layers at M = 1.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections import Counter
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from quant_kernels import HBM, timed  # noqa: E402  (graph replays of 20 calls, median of 5; the card's bandwidth)


def model_shapes(layers: str) -> Counter:
    from tpserve.kernels.choice import Kernels
    from tpserve.kernels.linear.gemv_triton import MIN_N
    from tpserve.model.config import ModelConfig
    from tpserve.model.glm5_next import Glm5NextModel
    from tpserve.model.layers import Linear, ShardContext
    from tpserve.tools.bench.model import real_width_config

    cfg = ModelConfig.from_dict(real_width_config(layers, False))
    with torch.device("meta"):
        model = Glm5NextModel(ShardContext.single(torch.bfloat16, "meta"), cfg, Kernels())
    return Counter(tuple(m.weight.shape) for m in model.modules()
                   if isinstance(m, Linear) and m.bias is None and m.weight.shape[0] >= MIN_N)


def _cycling(fns):
    """One callable that calls fns in turn (a captured graph of 20 calls reads 20 weight copies)."""
    it = itertools.cycle(fns)
    return lambda: next(it)()


def main() -> None:
    from tpserve.kernels.linear import gemv_triton

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", default="KKKM")
    ap.add_argument("--m", type=int, nargs="+", default=[1, 4, 8, 16])
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    shapes = model_shapes(args.layers)
    rows, step = [], {"cublas": 0.0, "triton": 0.0, "floor": 0.0}
    print("| N x K | layers | M | cuBLAS us | Triton us | floor us | Triton of floor | Triton / cuBLAS | "
          "max err cuBLAS | max err Triton |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for (n, k), count in sorted(shapes.items()):
        copies = max(1, -(-(256 << 20) // (2 * n * k)))
        ws = [torch.randn(n, k, device="cuda").div_(k ** 0.5).bfloat16() for _ in range(copies)]
        floor = 2 * n * k / HBM
        for m in args.m:
            x = torch.randn(m, k, device="cuda").bfloat16()
            ref = x.double() @ ws[0].double().T
            scale = ref.abs().max().item()
            err_c = ((F.linear(x, ws[0]).double() - ref).abs().max().item()) / scale
            err_t = ((gemv_triton.gemv(x, ws[0]).double() - ref).abs().max().item()) / scale
            t_c = timed(_cycling([lambda w=w: F.linear(x, w) for w in ws]))
            t_t = timed(_cycling([lambda w=w: gemv_triton.gemv(x, w) for w in ws]))
            rows.append({"n": n, "k": k, "layers": count, "m": m, "cublas_us": 1e6 * t_c, "triton_us": 1e6 * t_t,
                         "floor_us": 1e6 * floor, "err_cublas": err_c, "err_triton": err_t})
            if m == 1:
                step["cublas"] += count * t_c
                step["triton"] += count * t_t
                step["floor"] += count * floor
            print(f"| {n} x {k} | {count} | {m} | {1e6 * t_c:.1f} | {1e6 * t_t:.1f} | {1e6 * floor:.1f} | "
                  f"{100 * floor / t_t:.0f}% | {t_t / t_c:.2f} | {err_c:.1e} | {err_t:.1e} |", flush=True)
        del ws
    if 1 in args.m:
        print(f"per decode step at M = 1 ({args.layers}, these layers): cuBLAS {1e6 * step['cublas']:.1f} us, "
              f"Triton {1e6 * step['triton']:.1f} us, floor {1e6 * step['floor']:.1f} us")
    if args.json:
        Path(args.json).write_text(json.dumps({"layers": args.layers, "rows": rows,
                                               "step_m1_us": {k: 1e6 * v for k, v in step.items()}}, indent=1))


if __name__ == "__main__":
    main()
