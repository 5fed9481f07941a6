"""nvfp4_m1's experts with configs given on the command line, beside the defaults, in one process.

    PYTHONPATH=src python bench/m1_configs.py [--down 1:8:4,1:4:6] [--gate-up 1:2:3,1:2:2:8:ls] [--chain]
        [--tokens 1,2,8] [--json F]

A config is rows:splits:stages, then for gate|up optionally :pairs and :ls (kernels/nvfp4_m1.Config, the "shift"
decode, L2 hint 256: pairs a block, its warps in lock step). Each --down config is a form with gate|up at its
default, each --gate-up config one with down at its default. --chain adds each form again with `experts`' chain
(gate|up too a programmatic dependent of the kernel before it, here the call before's down, which lets it start). Down's blocks issue their
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


def parse_configs(text: str, flag: str, more: bool = False) -> dict[str, object]:
    """name -> nvfp4_m1.Config of each config in `text` (more: the optional :pairs and :ls fields too)."""
    from tpserve.kernels import nvfp4_m1 as m1

    out = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        fields = part.split(":")
        ls = more and len(fields) > 3 and fields[-1] == "ls"
        nums = fields[:-1] if ls else fields
        if not (len(nums) == 3 or more and len(nums) == 4) or not all(f.isdigit() for f in nums):
            form = "rows:splits:stages[:pairs][:ls]" if more else "rows:splits:stages"
            raise ValueError(f"{flag}: each config is {form} (integers), got {part!r}")
        r, s, st, *pg = (int(f) for f in nums)
        out[part] = m1.Config(r, s, st, pairs=pg[0] if pg else 1, lockstep=ls)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--down", default="", help="down configs, rows:splits:stages, comma-separated")
    ap.add_argument("--gate-up", default="", help="gate|up configs, rows:splits:stages[:pairs][:ls], comma-separated")
    ap.add_argument("--chain", action="store_true", help="each form also with the kernels chained (experts' chain)")
    ap.add_argument("--tokens", default="1,2,8")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    from tpserve.kernels import nvfp4_m1 as m1

    try:  # (Config checks each field's range)
        down, gate_up = parse_configs(args.down, "--down"), parse_configs(args.gate_up, "--gate-up", True)
        forms = {"default": (m1, None, None, {})}
        forms.update({f"down {k}": (m1, None, c, {}) for k, c in down.items()})
        forms.update({f"gate|up {k}": (m1, c, None, {}) for k, c in gate_up.items()})
        if args.chain:
            forms.update({f"{k} chained": (mod, cg, cd, {**kw, "chain": True})
                          for k, (mod, cg, cd, kw) in list(forms.items())})
    except ValueError as exc:
        ap.error(str(exc))
    from quant_decode_sweep import m1_forms_run

    m1_forms_run("m1configs", forms, args.tokens, args.json, ap.error)


if __name__ == "__main__":
    main()
