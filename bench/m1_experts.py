"""nvfp4_m1's MoE experts at decode (kernels/nvfp4_m1.py): the defaults beside configs given on the command line, and
beside copies whose weight decode does less (a bound on what a cheaper decode could give), in one process.

    PYTHONPATH=src python bench/m1_experts.py [--down 1:8:4,1:4:6] [--gate-up 1:2:3] [--decode-bound]
                                              [--tokens 1,2,8] [--json F]

A config is rows:splits:stages (kernels/nvfp4_m1.Config, the "shift" decode, L2 hint 256). Each --down config is a
form with gate|up at its default, each --gate-up config one with down at its default. Down's blocks issue their
first stages - 1 W stages before they wait on gate|up under PDL, so a deeper ring there is also more of down's
weights on their way while gate|up's last blocks run.

--decode-bound adds two forms, each a fresh copy of kernels/nvfp4_m1.py with `decode_fp4_shift`'s body replaced (so
gate|up and down both change; wrong values by design, not kernels to ship):
  one-op     each output word one shift and one mask of the code word (7 operations per 8 codes against the shift
             decode's 15): what a weight layout permuted at load time for the decode could at best cost
  none       the code word itself as the bf16 pair: the kernels' loads, MMAs and bookkeeping alone
If "none" is not clearly faster at one token, the one-token loss is not the decode's.

Every form is checked against fp32 math (large for the bound forms, by design) and timed three times in alternation
(bench/quant_decode_sweep.py's `_m1_alternate`: graph replays of 40 calls, 8 seeded routings in turn).
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

DECODE = re.compile(r"(void decode_fp4_shift\(unsigned w, unsigned\* r\) \{\n)(.*?)(\n\})", re.S)
BODIES = {
    "one-op": "  r[0] = w & 0x81C081C0u;\n  r[1] = (w >> 1) & 0x81C081C0u;\n  r[2] = (w >> 2) & 0x81C081C0u;\n"
              "  r[3] = (w >> 3) & 0x81C081C0u;",
    "none": "  r[0] = w;\n  r[1] = w;\n  r[2] = w;\n  r[3] = w;",
}


def parse_configs(text: str, flag: str) -> list[tuple[int, int, int]]:
    out = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        fields = part.split(":")
        if len(fields) != 3 or not all(f.isdigit() for f in fields):
            raise ValueError(f"{flag}: each config is rows:splits:stages (integers), got {part!r}")
        out.append(tuple(int(f) for f in fields))
    return out


def variant(name: str):
    """A fresh copy of kernels/nvfp4_m1.py whose decode_fp4_shift body is BODIES[name] (its own kernel cache)."""
    from tpserve.kernels.quant import nvfp4_m1_cuda as nvfp4_m1

    spec = importlib.util.spec_from_file_location(f"nvfp4_m1_{name.replace('-', '_')}", nvfp4_m1.__file__)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    patched, n = DECODE.subn(lambda m: m.group(1) + BODIES[name] + m.group(3), mod._SOURCE)
    if n != 1:
        raise RuntimeError(f"decode_fp4_shift: expected one definition in nvfp4_m1._SOURCE, found {n}")
    mod._SOURCE = patched
    return mod


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--down", default="", help="down configs, rows:splits:stages, comma-separated")
    ap.add_argument("--gate-up", default="", help="gate|up configs, rows:splits:stages, comma-separated")
    ap.add_argument("--decode-bound", action="store_true", help="add the one-op and none decode forms")
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
    if args.decode_bound:
        forms.update({name: (variant(name), None, None, {}) for name in BODIES})
    from quant_decode_sweep import m1_forms_run

    m1_forms_run("m1experts", forms, args.tokens, args.json, ap.error)


if __name__ == "__main__":
    main()
