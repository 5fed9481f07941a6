"""nvfp4_m1's outputs on fixed inputs, saved to compare two trees bit for bit: the MoE experts (defaults, PDL where
supported) at 1, 2 and 8 tokens and the one-row GEMV at 12288 x 4096 and 4096 x 12288.

    PYTHONPATH=TREE_A/src python bench/m1_same.py --save a.pt
    PYTHONPATH=TREE_B/src python bench/m1_same.py --save b.pt --compare a.pt
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from quant_decode_sweep import _experts_setup, _fp4  # noqa: E402


def outputs() -> dict:
    from tpserve.kernels.quant import nvfp4_m1_cuda as m1

    torch.manual_seed(0)
    P, e, d, i = _experts_setup()
    d2 = P["d2"].reshape(e, 1).contiguous()
    out = {}
    for t in (1, 2, 8):
        ids = torch.stack([torch.randperm(e, device="cuda")[:8] for _ in range(t)])
        w, x = torch.rand(t, 8, device="cuda"), torch.randn(t, d, device="cuda").bfloat16()
        out[f"experts t={t}"] = m1.experts(x, w, ids, P["gp"], P["gb"], P["g2"], P["dp"], P["db"], d2, 10.0).cpu()
    quantize = _fp4()[0]
    for n, k in ((12288, 4096), (4096, 12288)):
        packed, _ = quantize(torch.randn(n, k, device="cuda") / k**0.5)
        x = torch.randn(1, k, device="cuda").bfloat16()
        out[f"gemv {n}x{k}"] = m1.gemv(x, *packed).cpu()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--save", required=True)
    ap.add_argument("--compare", default=None, help="an earlier --save file: each output bit for bit against it")
    args = ap.parse_args()
    out = outputs()
    torch.save(out, args.save)
    if args.compare:
        ref = torch.load(args.compare)
        for k, v in out.items():
            same = torch.equal(v, ref[k])
            diff = (v.float() - ref[k].float()).abs().max().item()
            print(f"{k}: bit for bit {same} (max abs diff {diff:.3e})")


if __name__ == "__main__":
    main()
