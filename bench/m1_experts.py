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
(`alternate`: graph replays of 40 calls, 8 seeded routings in turn; the experts' weights and routings from
bench/quant_decode_sweep.py).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
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


def alternate(forms: dict, tokens) -> dict:
    """The experts at each token count (routings seeded), every form (name -> (nvfp4_m1 module, gate|up config, down
    config, more keywords)) checked against fp32 math, then timed three times in alternation (graph replays of 40
    calls, 8 routings in turn)."""
    import torch
    from quant_decode_sweep import _experts_setup, _nvfp4_moe_case
    from quant_kernels import rel, timed

    res: dict = {}
    P, e, d, i = _experts_setup()
    d2 = P["d2"].reshape(e, 1).contiguous()
    for t in tokens:
        torch.manual_seed(t)
        routes, touched, floor, ref = _nvfp4_moe_case(P, e, d, i, t)

        def run(r, f):
            mod, cg, cd, kw = f
            return mod.experts(r[2], r[1], r[0], P["gp"], P["gb"], P["g2"], P["dp"], P["db"], d2, 10.0, cg, cd, **kw)

        errs = {k: rel(run(routes[0], f), ref) for k, f in forms.items()}
        times = {k: [] for k in forms}
        for _ in range(3):
            for k, f in forms.items():
                times[k].append(timed([(lambda r=r, f=f: run(r, f)) for r in routes], reps=40) * 1e6)
        print(f"\nMoE nvfp4_m1 {t} token(s), {touched:.1f} experts touched, floor {floor * 1e6:.1f} us:", flush=True)
        for k in forms:
            print(f"  {k}: {' / '.join(f'{v:.1f}' for v in times[k])} us ({100 * floor * 1e6 / min(times[k]):.0f}% at "
                  f"best), rel err {errs[k]:.1e}", flush=True)
        res[f"m1experts t={t}"] = dict(floor_us=floor * 1e6, touched=touched, us=times, rel_err=errs)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--down", default="", help="down configs, rows:splits:stages, comma-separated")
    ap.add_argument("--gate-up", default="", help="gate|up configs, rows:splits:stages, comma-separated")
    ap.add_argument("--decode-bound", action="store_true", help="add the one-op and none decode forms")
    ap.add_argument("--tokens", default="1,2,8")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    try:
        tokens = [int(t) for t in args.tokens.split(",") if t.strip()]
    except ValueError:
        tokens = []
    if not tokens or any(t < 1 for t in tokens):
        ap.error(f"--tokens: positive integers, comma-separated, got {args.tokens!r}")
    import torch
    from tpserve.kernels.quant import nvfp4_m1_cuda as m1

    try:  # (Config checks each field's range)
        down, gate_up = parse_configs(args.down, "--down"), parse_configs(args.gate_up, "--gate-up")
        forms = {"default": (m1, None, None, {})}
        forms.update({f"down {r}:{s}:{st}": (m1, None, m1.Config(r, s, st), {}) for r, s, st in down})
        forms.update({f"gate|up {r}:{s}:{st}": (m1, m1.Config(r, s, st), None, {}) for r, s, st in gate_up})
    except ValueError as exc:
        ap.error(str(exc))
    if not torch.cuda.is_available():
        ap.error("needs a CUDA GPU (the nvfp4_m1 kernels)")
    if args.decode_bound:
        forms.update({name: (variant(name), None, None, {}) for name in BODIES})
    res = alternate(forms, tokens)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
