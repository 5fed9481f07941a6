"""One quantized decode GEMV config, launched a few times on its own, for Nsight Compute (ncu) to profile.

    ncu -k regex:'_nvfp4_row|_nvfp4_planes|_gemv_kernel|_fp8_row' --launch-skip 2 --launch-count 1 --set full \
        python bench/ncu_quant.py nvfp4-row 32 512 4 1 2

Cases: nvfp4-row / nvfp4-qa / nvfp4-qb / nvfp4-planes (the one-row kernel, qtile as the MMA's A / B operand, the
nibble-planes kernel) and fp8-row / fp8-qb (the FP8 one-row kernel, qtile B), then block_n block_k warps stages
waves; M rows of x (default 1, fp8-qb takes 8); 12288 x 4096 weights. The weights and calls are
quant_decode_sweep.py's; each config is checked against fp32 math first (relative error printed).
The CUDA kernels (kernel names start tpserve_): mma-nvfp4 / mma-fp8 ROWS SPLITS DEPTH M [SMEM [N K]]
(kernels/mma_gemv.py, interleaved, L2 fetching 256 bytes; SMEM 1: stage "smem"; N x K weights, default 12288 x
4096) and m1 ROWS SPLITS STAGES PREFETCH (kernels/nvfp4_m1.py, one row).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from quant_decode_sweep import _fp4, _fp8  # noqa: E402
from quant_kernels import rel  # noqa: E402

FORMS = {"nvfp4-row": (_fp4, "row"), "nvfp4-qa": (_fp4, "a"), "nvfp4-qb": (_fp4, "b"),
         "nvfp4-planes": (_fp4, "planes"), "fp8-row": (_fp8, False), "fp8-qb": (_fp8, "b")}


def cuda_case(case: str, a: list[int]) -> int:
    from tpserve.kernels.quant import gemv_cuda as mg
    from tpserve.kernels.quant import nvfp4_m1_cuda as m1

    fmt = "fp8" if case == "mma-fp8" else "nvfp4"
    quantize = (_fp8 if fmt == "fp8" else _fp4)()[0]
    n, k = (a[5], a[6]) if case != "m1" and len(a) >= 7 else (12288, 4096)
    packed, wd = quantize(torch.randn(n, k, device="cuda") / k**0.5)
    if case == "m1":
        cfg, m = m1.Config(*a[:4]), 1
        run = lambda x: m1.gemv(x, *packed, cfg=cfg)  # noqa: E731
    else:
        stage = "smem" if len(a) > 4 and a[4] else "regs"
        cfg, m = mg.Config(fmt, a[0], a[1], a[2], 256, True, 0, stage), a[3]
        gemv = mg.fp8_gemv if fmt == "fp8" else mg.nvfp4_gemv
        run = lambda x: gemv(x, *packed, cfg=cfg)  # noqa: E731
    x = torch.randn(m, k, device="cuda").bfloat16()
    print(f"{case} {cfg} M={m}: rel err {rel(run(x), x.float() @ wd.T):.2e}", flush=True)
    for _ in range(4):
        run(x)
    torch.cuda.synchronize()
    return 0


def main() -> int:
    if sys.argv[1] in ("mma-nvfp4", "mma-fp8", "m1"):
        return cuda_case(sys.argv[1], [int(v) for v in sys.argv[2:]])
    case, (bn, bk, nw, ns, wv) = sys.argv[1], map(int, sys.argv[2:7])
    m = int(sys.argv[7]) if len(sys.argv) > 7 else (8 if case == "fp8-qb" else 1)
    spec, form = FORMS[case]
    quantize, call, _, _ = spec()
    w = torch.randn(12288, 4096, device="cuda") / 4096**0.5
    packed, wd = quantize(w)
    x = torch.randn(m, 4096, device="cuda").bfloat16()
    config = (bn, bk, nw, ns, wv, form, False)
    print(f"{case} {config} M={m}: rel err {rel(call(x, packed, config), x.float() @ wd.T):.2e}", flush=True)
    for _ in range(4):
        call(x, packed, config)
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
