"""The indexer's decode top-k: kernels/indexer_triton.top_pools against torch.topk over the whole width.

    PYTHONPATH=src python bench/topk_pools.py [--pools 8192] [--k 128] [--kpool 16] [--json F]

A graph step scores every pool its block table addresses (8,192 at 131,072 positions, kpool 16) and the
torch path takes topk(k) of all of them; top_pools sorts only the pools complete at each token's position.
For rows of 1 and 16 tokens at several context lengths: the chosen pools of the single kernel and of the
chunked pair checked against a stable sort of the complete pools (random scores), then time per call from
CUDA-graph replays of 20 calls (median of 5).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from quant_kernels import timed  # noqa: E402  (graph replays of 20 calls, median of 5)


def main() -> None:
    from tpserve.kernels.attention.indexer_triton import top_pools

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pools", type=int, default=8192)
    ap.add_argument("--k", type=int, default=128)
    ap.add_argument("--kpool", type=int, default=16)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    low = torch.finfo(torch.float32).min
    rows = []
    print("| tokens | context | complete pools | torch.topk us | top_pools us | ratio | chunked us | ratio | "
          "chosen equal |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for n in (1, 16):
        for context in (1152, 4096, 16384, 65536, args.pools * args.kpool):
            pos = torch.full((n,), context - 1, dtype=torch.long, device="cuda")
            v = min(context // args.kpool, args.pools)
            s = torch.randn(n, args.pools, device="cuda")
            s[:, v:] = low  # as decode_scores leaves the pools not complete yet
            m = min(v, args.k)
            want = torch.sort(s[:, :v], dim=-1, descending=True, stable=True).indices[:, :m]
            equal = all(torch.equal(got[:, :m], want) and bool((got[:, m:] == args.pools).all())
                        for got in (top_pools(s, pos, args.k, args.kpool),
                                    top_pools(s, pos, args.k, args.kpool, chunked=True)))
            t_torch = timed(lambda: s.topk(args.k, dim=-1).indices)
            t_ours = timed(lambda: top_pools(s, pos, args.k, args.kpool))
            t_chunk = timed(lambda: top_pools(s, pos, args.k, args.kpool, chunked=True))
            rows.append({"tokens": n, "context": context, "pools": v, "torch_us": 1e6 * t_torch,
                         "top_pools_us": 1e6 * t_ours, "chunked_us": 1e6 * t_chunk, "equal": equal})
            print(f"| {n} | {context} | {v} | {1e6 * t_torch:.1f} | {1e6 * t_ours:.1f} | {t_ours / t_torch:.2f} | "
                  f"{1e6 * t_chunk:.1f} | {t_chunk / t_torch:.2f} | {equal} |", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
