"""One quantized decode GEMV config, launched a few times on its own, for Nsight Compute (ncu) to profile.

    ncu -k regex:'_nvfp4_row|_gemv_kernel|_fp8_row' --launch-skip 2 --launch-count 1 --set full \
        python bench/ncu_quant.py nvfp4-row 32 512 4 1 2

Cases: nvfp4-row / nvfp4-qa / nvfp4-qb (the one-row kernel, qtile as the MMA's A / B operand) and fp8-row /
fp8-qb (the FP8 one-row kernel, qtile B), then block_n block_k warps stages waves; M rows of x (default 1, fp8-qb
takes 8); 12288 x 4096 weights. Each config is checked against fp32 math first (relative error printed).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from tpserve.kernels import quant_ref as qr  # noqa: E402
from tpserve.kernels.quant_gemv import w4a16_gemv, w8a16_gemv  # noqa: E402


def main() -> int:
    case, bn, bk, nw, ns, wv = sys.argv[1], *map(int, sys.argv[2:7])
    m = int(sys.argv[7]) if len(sys.argv) > 7 else (8 if case == "fp8-qb" else 1)
    n, k = 12288, 4096
    w = torch.randn(n, k, device="cuda") / k**0.5
    x = torch.randn(m, k, device="cuda").bfloat16()
    kw = dict(block_n=bn, block_k=bk, num_warps=nw, num_stages=ns, waves=wv)
    if case.startswith("nvfp4"):
        p, bs, s2 = qr.nvfp4_quantize(w)
        wd = qr.nvfp4_dequantize(p, bs, s2)
        s2r = s2.reshape(1).expand(n).contiguous()
        extra = dict(row=True) if case == "nvfp4-row" else dict(qtile=True, qtile_a=case == "nvfp4-qa",
                                                                  fp32_decode=False)
        fn = lambda: w4a16_gemv(x, p, bs, s2r, **kw, **extra)  # noqa: E731
    else:
        q, s = qr.fp8_block_quantize(w)
        wd = qr.fp8_block_dequantize(q, s)
        extra = dict(qtile=True, qtile_a=False) if case == "fp8-qb" else {}
        fn = lambda: w8a16_gemv(x, q, s, (128, 128), **kw, **extra)  # noqa: E731
    ref = x.float() @ wd.T
    y = fn().float()
    print(f"{case} {sys.argv[2:]} M={m}: rel err {((y - ref).abs().max() / ref.abs().max()).item():.2e}", flush=True)
    for _ in range(4):
        fn()
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
