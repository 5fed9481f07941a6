"""nvfp4_m1's experts with configs given on the command line, beside the defaults, in one process.

    PYTHONPATH=src python bench/m1_configs.py [--down 1:8:4,1:4:6] [--gate-up 1:2:3] [--tokens 1,2,8] [--json F]

A config is rows:splits:stages (kernels/nvfp4_m1.Config, the "shift" decode, L2 hint 256). Each --down config is a
form with gate|up at its default, each --gate-up config one with down at its default. Down's blocks issue their
first stages - 1 W stages before they wait on gate|up under PDL, so a deeper ring there is also more of down's
weights on their way while gate|up's last blocks run. Every form is checked against fp32 math and timed three
times in alternation (bench/quant_decode_sweep.py's `_m1_alternate`: graph replays of 40 calls, 8 seeded routings
in turn).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def parse_configs(text: str, flag: str) -> list[tuple[int, int, int]]:
    out = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        fields = part.split(":")
        if len(fields) != 3 or not all(f.isdigit() for f in fields):
            raise ValueError(f"{flag}: each config is rows:splits:stages (integers), got {part!r}")
        out.append(tuple(int(f) for f in fields))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--down", default="", help="down configs, rows:splits:stages, comma-separated")
    ap.add_argument("--gate-up", default="", help="gate|up configs, rows:splits:stages, comma-separated")
    ap.add_argument("--tokens", default="1,2,8")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    from tpserve.kernels.quant import nvfp4_m1_cuda as m1

    try:  # (Config checks each field's range)
        down, gate_up = parse_configs(args.down, "--down"), parse_configs(args.gate_up, "--gate-up")
        forms = {"default": (m1, None, None, {})}
        forms.update({f"down {r}:{s}:{st}": (m1, None, m1.Config(r, s, st), {}) for r, s, st in down})
        forms.update({f"gate|up {r}:{s}:{st}": (m1, m1.Config(r, s, st), None, {}) for r, s, st in gate_up})
    except ValueError as exc:
        ap.error(str(exc))
    from quant_decode_sweep import m1_forms_run

    m1_forms_run("m1configs", forms, args.tokens, args.json, ap.error)


if __name__ == "__main__":
    main()
