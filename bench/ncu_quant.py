"""One quantized decode GEMV config, launched a few times on its own, for Nsight Compute (ncu) to profile.

    ncu -k regex:'_nvfp4_row|_nvfp4_planes|_gemv_kernel|_fp8_row' --launch-skip 2 --launch-count 1 --set full \
        python bench/ncu_quant.py nvfp4-row 32 512 4 1 2

Cases: nvfp4-row / nvfp4-qa / nvfp4-qb / nvfp4-planes (the one-row kernel, qtile as the MMA's A / B operand, the
nibble-planes kernel) and fp8-row / fp8-qb (the FP8 one-row kernel, qtile B), then block_n block_k warps stages
waves; M rows of x (default 1, fp8-qb takes 8); 12288 x 4096 weights. The weights and calls are
quant_decode_sweep.py's; each config is checked against fp32 math first (relative error printed).
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


def main() -> int:
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
