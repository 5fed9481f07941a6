"""`tpserve make-tiny DIR`: write a small random glm5_next checkpoint."""

from __future__ import annotations


def register(sub, bench, tune) -> None:
    p = sub.add_parser("make-tiny", help="write a tiny random glm5_next checkpoint (tests)")
    p.add_argument("dir", help="output directory (must not exist or be empty, unless --force)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--layers", type=int, default=4, help="number of layers (KDA x3 then MLA, repeating)")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32")
    p.add_argument("--mtp", action="store_true",
                   help="add the MTP layer (layer --layers, the published layout) for speculative decoding")
    p.add_argument("--force", action="store_true", help="write into a directory that already has files")
    p.set_defaults(func=run)


def run(args) -> int:
    from pathlib import Path

    from tpserve.engine.setup import DTYPES
    from tpserve.model.tiny import make_tiny

    if args.layers < 1:
        raise SystemExit("make-tiny: --layers must be at least 1")
    out = Path(args.dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not args.force:
        raise SystemExit(f"make-tiny: {out} already exists and is not empty; pass --force to overwrite it")
    out = make_tiny(args.dir, seed=args.seed, layers=args.layers, dtype=DTYPES[args.dtype], mtp=args.mtp)
    print(f"wrote a tiny glm5_next checkpoint to {out}")
    return 0
