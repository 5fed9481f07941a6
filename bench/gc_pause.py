"""A full garbage collection's pause in a booted engine: with the boot's objects frozen (what the warm-up leaves,
engine/warmup.py `freeze_heap`) and with nothing frozen (as before the warm-up froze them).

    python bench/gc_pause.py [--device cpu] [--model DIR] [--repeats 3]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

from tpserve import LLM


def pauses(repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        gc.collect()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--model", default=None)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    llm = LLM(args.model, device=args.device, warmup=True)
    frozen = gc.get_freeze_count()
    with_freeze = pauses(args.repeats)
    gc.unfreeze()
    without = pauses(args.repeats)
    print(f"objects frozen by the warm-up: {frozen:,}")
    print(f"full collection, the boot frozen: median {statistics.median(with_freeze):.1f} ms")
    print(f"full collection, nothing frozen: median {statistics.median(without):.1f} ms "
          f"({', '.join(f'{p:.1f}' for p in without)})")
    llm.shutdown()


if __name__ == "__main__":
    main()
