"""nvfp4_m1's one-token experts with gate|up's last blocks asking L2 for down's weights as they end (Config.tail),
beside the defaults, in one process.

    PYTHONPATH=src python bench/m1_tail.py [--tokens 1,2] [--json F]

At one token gate|up's blocks end by age, from ~15 to ~26 us (bench/m1_timeline.py), and DRAM streams little from
~24 us while its last blocks run and down waits for them. With `tail` the blocks of the later half of the pairs,
which end last, each issue bulk L2 prefetches (16 KiB) of one slice of down's W and scales of the token's choices
(512 slices of 64 rows), so that down's blocks read them from L2. Forms: default; tail 1 (plain prefetches);
tail 2 (an evict_last policy). At more than one token the prefetches are off (the forms are the same kernels
bar the check). Each form is timed three times in alternation (bench/quant_decode_sweep.py's `_m1_alternate`:
graph replays of 40 calls, 8 seeded routings in turn), checked against fp32 math.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", default="1,2")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    from quant_decode_sweep import m1_forms_run

    from tpserve.kernels import nvfp4_m1 as m1

    base = m1.default_config("gate_up", 2048)
    forms = {"default": (m1, None, None, {})}
    forms.update({f"tail {t}": (m1, dataclasses.replace(base, tail=t), None, {}) for t in (1, 2)})
    m1_forms_run("m1tail", forms, args.tokens, args.json, ap.error)


if __name__ == "__main__":
    main()
