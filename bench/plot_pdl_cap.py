"""The FP8 GEMV's share of its bandwidth floor against rows of x, launched plainly, as PDL dependents without the
one-wave cap and with it (BENCHMARKS.md, twenty-seventh session): a PNG from the two sweeps' JSON.

    python bench/plot_pdl_cap.py [--cap bench/results/s27e_mmacap.json] [--pdl bench/results/s27g_mmapdl.json]
                                 [--out bench/results/s27_fp8_pdl_cap.png]

From --cap (`quant_decode_sweep.py --sections mmacap`, whose PDL launches then took no cap unasked): mma_gemv's
default config without a cap, plain and PDL, at 1, 2 and 8 rows. From --pdl (`--sections mmapdl` on the final
tree): w8a16_gemv's default, plain (at one row the Triton row kernel) and PDL (mma_gemv with the cap), 1-8 rows.
Each point is the best of the two timings of its form.
"""

from __future__ import annotations

import argparse
import json


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cap", default="bench/results/s27e_mmacap.json")
    ap.add_argument("--pdl", default="bench/results/s27g_mmapdl.json")
    ap.add_argument("--out", default="bench/results/s27_fp8_pdl_cap.png")
    args = ap.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cap, pdl = json.load(open(args.cap)), json.load(open(args.pdl))
    shapes = ("12288x4096", "4096x12288")
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, shape in zip(axes, shapes):
        def pct(rec, form):
            return 100 * rec["floor_us"] / min(rec[form])

        ms = (1, 2, 8)
        ax.plot(ms, [pct(cap[f"mmacap fp8 {shape} M={m} cap=0"], "pdl_us") for m in ms], "v--",
                label="PDL, no cap (mma_gemv)")
        ms = (1, 2, 4, 8)
        ax.plot(ms, [pct(pdl[f"mmapdl fp8 {shape} M={m}"], "plain_us") for m in ms], "o-",
                label="plain (w8a16_gemv default)")
        ax.plot(ms, [pct(pdl[f"mmapdl fp8 {shape} M={m}"], "pdl_us") for m in ms], "s-",
                label="PDL, one-wave cap (default)")
        ax.axhline(80, color="gray", lw=0.8, ls=":", label="issue 11's goal, 80%")
        ax.set_title(f"FP8 W8A16 GEMV {shape.replace('x', ' x ')}")
        ax.set_xlabel("rows of x (M)")
        ax.set_xticks(ms)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("% of the 11.7 us bandwidth floor (4.3 TB/s)")
    axes[0].legend(loc="lower left", fontsize=8)
    fig.suptitle("A chain of calls in one CUDA graph, H200 (twenty-seventh session)")
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
