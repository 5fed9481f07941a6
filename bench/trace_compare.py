"""Several multi-turn traces side by side (`bench serve --dataset multiturn --json`, e.g. bench/replicas_gpu.sh's one
per routing policy): hit rate and TTFT p50 per turn, as a table and a PNG.

    python bench/trace_compare.py LABEL=trace.json [LABEL=trace.json ...] [--png out.png] [--title T]
"""

from __future__ import annotations

import argparse
import json


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("traces", nargs="+", metavar="LABEL=JSON")
    ap.add_argument("--png", default=None)
    ap.add_argument("--title", default="multi-turn trace")
    args = ap.parse_args()
    runs = []
    for item in args.traces:
        label, _, path = item.partition("=")
        if not path:
            raise SystemExit(f"{item!r}: give LABEL=path.json")
        level = json.loads(open(path).read())["levels"][0]
        runs.append((label, level))
    print("| trace | hit rate | " + " | ".join(f"turn {r['turn']}" for r in runs[0][1]["turns"][1:]) + " |")
    print("| --- | --- |" + " --- |" * (len(runs[0][1]["turns"]) - 1))
    for label, level in runs:
        cached = sum(r["cached_tokens"] for r in level["turns"])
        ideal = sum(r["ideal_tokens"] for r in level["turns"])
        per_turn = " | ".join(f"{100 * (r['hit_rate'] or 0):.1f}%" for r in level["turns"][1:])
        print(f"| {label} | {100 * cached / max(ideal, 1):.1f}% | {per_turn} |")
    if args.png:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        for k, (label, level) in enumerate(runs):
            turns = [r["turn"] for r in level["turns"]]
            axes[0].plot(turns[1:], [100 * (r["hit_rate"] or 0) for r in level["turns"][1:]], marker="o",
                         color=f"C{k}", label=label)
            axes[1].plot(turns, [r["ttft_ms"]["p50"] for r in level["turns"]], marker="o", color=f"C{k}",
                         label=f"{label}, cache")
            axes[1].plot(turns, [r["ttft_cold_ms"]["p50"] for r in level["turns"]], marker="x", linestyle="--",
                         color=f"C{k}", label=f"{label}, no cache")
        axes[0].set_title("prefix cache hit rate per turn (% of ideal)")
        axes[0].set_ylim(0, 105)
        axes[1].set_title("TTFT p50 per turn (ms)")
        for ax in axes:
            ax.set_xlabel("turn")
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=8)
        fig.suptitle(args.title)
        fig.tight_layout()
        fig.savefig(args.png, dpi=110)
        plt.close(fig)
        print(f"wrote {args.png}")


if __name__ == "__main__":
    main()
