"""Prefill-side kernels against their torch forms at real widths on a GPU: the KDA short conv of a prefill chunk
(kernels/kda_prep_triton.conv_chunk vs kernels/conv.causal_conv_seq), the grouped MoE's combine
(kernels/route_triton.combine_sorted vs the fp32 index_add of kernels/moe.experts_grouped) and the mHC stream
norm + projection (kernels/hc_project_triton.hc_project vs norm_triton.rms_normalize + the fp32 F.linear, the
path it replaces in prefill steps; both also against float64 on the first 512 rows).

    python bench/prefill_kernels.py [--tokens 4096 16384] [--json FILE]

Checks (max |difference| over the output's max |value|, bf16) and times per call (CUDA events, median of 20 after
warm-up), with each kernel's floor (bytes / the card's HBM bandwidth). cuda only.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
from quant_kernels import card_figures  # bench/ (the script's directory)

HBM, _ = card_figures()


def timed(fn, reps: int = 20) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return statistics.median(times)


def main() -> None:
    from tpserve.kernels.attention import conv
    from tpserve.kernels.attention.kda_prep_triton import conv_chunk
    from tpserve.kernels.norms.hc_project_triton import hc_project
    from tpserve.kernels.norms.mhc import project_weight
    from tpserve.kernels.norms.norm_triton import rms_normalize
    from tpserve.kernels.moe.route_triton import combine_sorted

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, nargs="*", default=[4096, 16384])
    ap.add_argument("--hc-block-t", type=int, nargs="*", default=[],
                    help="also time hc_project with these rows per program")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    dev, bf16 = torch.device("cuda"), torch.bfloat16
    g = torch.Generator(dev).manual_seed(0)
    rows = []
    print("| kernel | tokens | torch ms | ours ms | ratio | floor ms | max diff / max |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for n in args.tokens:
        c, kw = 3 * 8192, 4  # KDA q | k | v channels at real width, short conv of 4
        x = torch.randn(n, c, device=dev, generator=g).to(bf16)
        state = torch.randn(c, kw - 1, device=dev, generator=g).to(bf16)
        w = torch.randn(c, kw, device=dev, generator=g) / 2
        want, want_state = conv.causal_conv_seq(x, state, w)
        got, got_state = conv_chunk(x, state, w)
        diff = float((got.float() - want.float()).abs().max() / want.float().abs().max())
        assert torch.equal(got_state, want_state.to(bf16)), "conv_chunk: state differs"
        t_torch, t_ours = timed(lambda: conv.causal_conv_seq(x, state, w)), timed(lambda: conv_chunk(x, state, w))
        floor = 2 * x.numel() * 2 / HBM
        rows.append({"kernel": "conv_chunk", "tokens": n, "torch_ms": 1e3 * t_torch, "ours_ms": 1e3 * t_ours,
                     "floor_ms": 1e3 * floor, "rel_diff": diff})
        k, d, e = 8, 4096, 288  # MoE: 8 of 288 experts, hidden 4096
        ids = torch.stack([torch.randperm(e, device=dev, generator=g)[:k] for _ in range(min(n, 64))])
        ids = ids.repeat(-(-n // ids.shape[0]), 1)[:n]
        order = torch.argsort(ids.reshape(-1), stable=True)
        y = torch.randn(n * k, d, device=dev, generator=g).to(bf16)
        wt = torch.rand(n, k, device=dev, generator=g)

        def torch_combine():
            yw = y.float() * wt.reshape(-1)[order, None]
            return torch.zeros(n, d, device=dev).index_add_(0, order // k, yw).to(bf16)

        want = torch_combine()
        got = combine_sorted(y, order, wt)
        diff = float((got.float() - want.float()).abs().max() / want.float().abs().max())
        t_torch, t_ours = timed(torch_combine), timed(lambda: combine_sorted(y, order, wt))
        floor = (y.numel() + n * d) * 2 / HBM
        rows.append({"kernel": "combine_sorted", "tokens": n, "torch_ms": 1e3 * t_torch, "ours_ms": 1e3 * t_ours,
                     "floor_ms": 1e3 * floor, "rel_diff": diff})
        hd, wd, eps = 4 * 4096, 24, 1e-5  # mHC: 4 streams of hidden 4096, (2 + 4) * 4 projections
        streams = (torch.randn(n, hd, device=dev, generator=g) * 2).to(bf16)
        fn = torch.randn(wd, hd, device=dev, generator=g) * 0.01
        parts = project_weight(fn, bf16)

        def before():
            return torch.nn.functional.linear(rms_normalize(streams, eps), fn)

        want, got = before(), hc_project(streams, parts, eps)
        diff = float((got - want).abs().max() / want.abs().max())
        x64 = streams[:512].double()
        ref = (x64 @ fn.double().T) / torch.sqrt(x64.square().mean(-1, keepdim=True) + eps)
        err = {name: float((v[:512].double() - ref).abs().max() / ref.abs().max()) for name, v in
               (("before", want), ("ours", got))}
        t_torch, t_ours = timed(before), timed(lambda: hc_project(streams, parts, eps))
        floor = streams.numel() * 2 / HBM
        rows.append({"kernel": "hc_project", "tokens": n, "torch_ms": 1e3 * t_torch, "ours_ms": 1e3 * t_ours,
                     "floor_ms": 1e3 * floor, "rel_diff": diff, "rel_err_fp64": err})
        print(f"hc_project at {n} tokens, max |error| / max |float64| on 512 rows: before {err['before']:.1e}, "
              f"ours {err['ours']:.1e}")
        for bt in args.hc_block_t:
            alt = hc_project(streams, parts, eps, bt)
            ms = 1e3 * timed(lambda: hc_project(streams, parts, eps, bt))
            rows[-1][f"ours_ms_block_t_{bt}"] = ms
            print(f"hc_project at {n} tokens, {bt} rows per program: {ms:.3f} ms, "
                  f"max |difference| to the default {float((alt - got).abs().max() / got.abs().max()):.1e}")
        for r in rows[-3:]:
            print(f"| {r['kernel']} | {n} | {r['torch_ms']:.3f} | {r['ours_ms']:.3f} | "
                  f"{r['ours_ms'] / r['torch_ms']:.2f} | {r['floor_ms']:.3f} | {r['rel_diff']:.1e} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
