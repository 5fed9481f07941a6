"""A chain of decode GEMVs in one CUDA graph, each launched plainly or as a programmatic dependent of the one before
(kernels/gemv_triton.py `pdl`): what programmatic dependent launch takes off each kernel boundary.

    python bench/pdl_chain.py [--repeats 8] [--rows 1] [--replays 50] [--json F]

The chain cycles through the real-width KKKM model's dense shapes so that each output is the next input:
x [M, 4096] -> 2048 x 4096 -> 4096 x 2048 -> 8192 x 4096 -> 4096 x 8192 -> ..., `--repeats` times, every
weight its own copy (1.3 GB at 8 repeats: L2 holds none of it). Each form is captured once and replayed; the
median replay over the number of kernels is the time a kernel; the floor is the weights' bytes / the card's HBM
bandwidth. The outputs of the forms must be bit for bit equal (the same tiles, the same sums). At more than one row
`gemv` launches plainly with or without `pdl` (a control: both forms run the same kernel). CUDA only (sm_90+ for PDL).
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from tpserve.kernels.linear import gemv_triton
from quant_kernels import card_figures  # bench/ (the script's directory)

SHAPES = [(2048, 4096), (4096, 2048), (8192, 4096), (4096, 8192)]  # (N, K): each N is the next K
BANDWIDTH, _ = card_figures()


def chain(x: torch.Tensor, weights: list[torch.Tensor], pdl: bool) -> torch.Tensor:
    for w in weights:
        x = gemv_triton.gemv(x, w, pdl=pdl)
    return x


def timed(fn, replays: int) -> tuple[float, torch.Tensor]:
    """(median seconds of one replay of fn's graph, the graph's output): the output is what the PDL edges
    produced, compared bit for bit below (quant_kernels.timed times eagerly where capture fails and keeps no
    output)."""
    fn()  # (autotune, compile) outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return statistics.median(times), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=8)
    ap.add_argument("--rows", type=int, default=1)
    ap.add_argument("--replays", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=3, help="each form timed this many times, in alternation")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("pdl_chain: needs a CUDA device")
    torch.manual_seed(0)
    dev = torch.device("cuda")
    weights = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) / k ** 0.5
               for _ in range(args.repeats) for n, k in SHAPES]
    x = torch.randn(args.rows, SHAPES[0][1], device=dev, dtype=torch.bfloat16)
    floor = sum(w.numel() * 2 for w in weights) / BANDWIDTH
    kernels = len(weights)
    rows, outs = {"plain": [], "pdl": []}, {}
    for _ in range(args.rounds):
        for form in rows:
            t, out = timed(lambda: chain(x, weights, form == "pdl"), args.replays)
            rows[form].append(t)
            outs[form] = out.clone()
    same = torch.equal(outs["plain"], outs["pdl"])
    print(f"chain: {kernels} GEMVs, M = {args.rows}, weights {sum(w.numel() * 2 for w in weights) / 1e9:.2f} GB, "
          f"floor {floor * 1e6:.1f} us; outputs bit for bit equal: {same}")
    print("| form | chain us (each round) | median us | us a kernel | of floor |")
    print("| --- | --- | --- | --- | --- |")
    med = {}
    for form, ts in rows.items():
        med[form] = statistics.median(ts)
        print(f"| {form} | {' / '.join(f'{t * 1e6:.1f}' for t in ts)} | {med[form] * 1e6:.1f} | "
              f"{med[form] * 1e6 / kernels:.2f} | {floor / med[form]:.0%} |")
    print(f"pdl / plain: {med['pdl'] / med['plain']:.3f}; saved {(med['plain'] - med['pdl']) * 1e6 / kernels:.2f} us "
          "a kernel boundary")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "kernels": kernels, "floor_s": floor, "rounds_s": rows, "equal": same}, f,
                      indent=1)
    if not same:
        raise SystemExit("pdl_chain: the PDL chain's output differs from the plain chain's")


if __name__ == "__main__":
    main()
