"""How much of the one-token NVFP4 experts' time is the weight decode's ALU work: nvfp4_m1's experts beside copies of
the module whose `decode_fp4_shift` does less (wrong values; a bound on what a cheaper decode could give, not a
kernel to ship).

    PYTHONPATH=src python bench/m1_alu_bound.py [--tokens 1,2,8] [--json F]

Forms (each a fresh copy of kernels/nvfp4_m1.py with the decode's body replaced, so gate|up and down both change):
  default    the shift decode: per 8 codes 7 shifts (multiplies where left) and 8 logic operations
  one-op     each output word one shift and one mask of the code word (1 + 3 x 2 = 7 operations per 8 codes): what
             a weight layout permuted at load time for the decode could at best cost
  none       the code word itself as the bf16 pair (no operation): the kernels' loads, MMAs and bookkeeping alone
Each form is timed three times in alternation (bench/quant_decode_sweep.py's `_m1_alternate`: graph replays of 40
calls, 8 seeded routings in turn); its relative error against fp32 math is printed and is large for the two bound
forms by design. Nsight Compute placed these kernels at ~50-59% ALU pipe busy (BENCHMARKS.md, nineteenth and
twenty-eighth sessions): if "none" is not clearly faster at one token, the one-token loss is not the decode's.
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
    ap.add_argument("--tokens", default="1,2,8")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    from quant_decode_sweep import m1_forms_run

    from tpserve.kernels.quant import nvfp4_m1_cuda as nvfp4_m1

    forms = {"default": (nvfp4_m1, None, None, {})}
    forms.update({name: (variant(name), None, None, {}) for name in BODIES})
    m1_forms_run("m1alu", forms, args.tokens, args.json, ap.error)


if __name__ == "__main__":
    main()
