"""A graph step's host inputs (engine/graphs.py `_fill`): this tree's against a git revision's, in one process.

    python bench/fill_ab.py --base REV [--rounds 4]

Loads `src/tpserve/engine/graphs.py` as it is at REV (`git show`), binds that revision's `_fill` and `_views`
to this tree's StepGraphs of the demo model (CPU, padded steps, k=5, 64 sequences), and times both on the
same plans, alternating round by round: decode steps of 1 and 64 sequences, verify steps of 1 and 16
sequences x 6 rows (20-block tables). Prints us per call, the minimum over rounds of 7 repeats of 100 calls
each (this machine's speed drifts; the minimum is the least disturbed). The revision's `_fill` must take the
same arguments and buffers as this tree's.
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import timeit
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import host_overhead  # noqa: E402

CASES = ((1, 1), (64, 1), (1, 6), (16, 6))  # (sequences, rows each)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="the git revision to compare with")
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args()
    root = Path(__file__).resolve().parents[1]
    source = subprocess.run(["git", "show", f"{args.base}:src/tpserve/engine/graphs.py"], cwd=root, check=True,
                            capture_output=True, text=True).stdout
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(source)
    spec = importlib.util.spec_from_file_location("graphs_base", f.name)
    base = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(base)
    llm, g = host_overhead.padded_graphs(5, 64)
    versions = {args.base: (types.MethodType(base.StepGraphs._fill, g), types.MethodType(base.StepGraphs._views, g)),
                "this tree": (g._fill, g._views)}
    times: dict[tuple[str, int, int], list[float]] = {}
    for _ in range(args.rounds):
        for name, (fill, views) in versions.items():
            g._views = views
            for n, q in CASES:
                plan, b = host_overhead.fill_case(g, n, q)
                for _ in range(20):
                    fill(plan, b, q)
                best = min(timeit.repeat(lambda: fill(plan, b, q), number=100, repeat=7)) / 100 * 1e6
                times.setdefault((name, n, q), []).append(best)
    print("| `_fill` | " + " | ".join(f"{n} x {q} rows" for n, q in CASES) + " |")
    print("| --- |" + " --- |" * len(CASES))
    for name in versions:
        print(f"| {name} | " + " | ".join(f"{min(times[(name, n, q)]):.1f} us" for n, q in CASES) + " |")
    llm.shutdown()


if __name__ == "__main__":
    main()
