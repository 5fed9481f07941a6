"""`tpserve bench collectives` and `tpserve tune collectives`.

bench: every collective backend side by side (spawns --world ranks on this machine): median
latency and bus bandwidth per size, and the backend the size table picks; `--check` first runs
every path against a locally computed plain sum and exits 1 on any mismatch; `--plot FILE` draws
latency against size; `--graph` (CUDA) times inside CUDA graph replays.
tune: times the same candidates and writes the winners as a size table into the tuned cache
(or --out), which Communicators on this machine then load; for the fused ops, whether the fused
kernel or the separate ops won at each size.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

_BACKEND_ORDER = ("torch", "oneshot", "twoshot", "chunked", "ring", "symm_oneshot", "symm_twoshot",
                  "unfused", "fused")
_ALL_OPS = ("all_reduce,all_gather,reduce_scatter,all_reduce_add_rmsnorm,all_reduce_hc_expand,"
            "reduce_scatter_moe_combine")
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20,
          "mb": 1 << 20, "mib": 1 << 20, "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30}


def parse_size(text: str) -> int:
    s = text.strip().lower()
    num = s.rstrip("abcdefghijklmnopqrstuvwxyz")
    if not num or s[len(num):] not in _UNITS:
        raise argparse.ArgumentTypeError(f"cannot read {text!r} as a size (try 4K, 1M, 65536)")
    return int(float(num) * _UNITS[s[len(num):]])


def parse_sizes(text: str) -> list[int]:
    """'4K,64K,1M' (a list) or '1K:16M' (every power of two between, inclusive)."""
    sizes: list[int] = []
    for part in text.split(","):
        if ":" in part:
            lo, hi = (parse_size(p) for p in part.split(":", 1))
            size = 1 << max(0, lo - 1).bit_length()
            while size <= hi:
                sizes.append(size)
                size *= 2
        elif part.strip():
            sizes.append(parse_size(part))
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"no positive sizes in {text!r}")
    return sorted(set(sizes))


def _fmt_bytes(n: int) -> str:
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div}{unit}"
    return f"{n}B"


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--world", type=int, default=2, help="ranks to spawn (default 2)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="cpu (gloo + shared memory) or cuda (NCCL + peer memory); auto: cuda "
                        "when there are enough GPUs")
    p.add_argument("--sizes", type=parse_sizes, default=None,
                   help="bytes per call: '4K,64K,1M' or '1K:16M' (powers of two); default "
                        "1K:16M on cpu, 1K:256M on cuda")
    p.add_argument("--dtypes", default=None,
                   help="comma list of float32,bfloat16,float16 (default: float32 on cpu, "
                        "bfloat16 on cuda)")
    p.add_argument("--ops", default=_ALL_OPS,
                   help=f"collectives to time, comma-separated (default: {_ALL_OPS})")
    p.add_argument("--workspace-mb", type=int, default=8, help="per-rank workspace (MiB)")
    p.add_argument("--allreduce-topology", choices=("mesh", "ring"), default="mesh",
                   help="the workspace's topology, as --allreduce-topology of the engine (default: mesh)")
    p.add_argument("--table", default=None, help="size table JSON to show picks from")
    p.add_argument("--iter-scale", type=float, default=1.0, help="scale the iteration counts")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds before giving up")
    p.add_argument("--plot", metavar="FILE",
                   help="write a log-log plot (PNG) of the measured latency per size and backend")


def register(sub: Any, bench: Any, tune: Any) -> None:
    p = bench.add_parser("collectives", help="time every collective backend side by side")
    _common(p)
    p.add_argument("--check", action="store_true",
                   help="first verify every path against a plain sum; exit 1 on a mismatch")
    p.add_argument("--graph", action="store_true", help="time inside CUDA graph replays")
    p.add_argument("--json", metavar="FILE", help="write every measurement as JSON")
    p.add_argument("--no-timing", action="store_true", help="with --check: only check")
    p.add_argument("--inject-fault", metavar="BACKEND", help=argparse.SUPPRESS)
    p.set_defaults(func=run_bench)
    t = tune.add_parser("collectives", help="measure backends and write a tuned size table")
    _common(t)
    t.add_argument("--out", metavar="FILE", help="write the table here instead of the cache")
    t.add_argument("--graph", action="store_true", help="time inside CUDA graph replays")
    t.add_argument("--from-json", metavar="FILE",
                   help="build the table from `bench collectives --json` output, no measuring")
    t.set_defaults(func=run_tune)


def _spec(args: argparse.Namespace) -> dict:
    import torch
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() and torch.cuda.device_count() >= args.world \
            else "cpu"
    if args.world < 2:
        raise SystemExit("--world must be at least 2")
    if device == "cuda" and torch.cuda.device_count() < args.world:
        raise SystemExit(f"--world {args.world} needs {args.world} GPUs; "
                         f"{torch.cuda.device_count()} visible")
    if getattr(args, "graph", False) and device != "cuda":
        raise SystemExit("--graph needs --device cuda")
    dtypes = (args.dtypes or ("bfloat16" if device == "cuda" else "float32")).split(",")
    ops = args.ops.split(",")
    from tpserve.collectives.tuning import OPS
    from tpserve.tools.bench.collectives_common import DTYPES, FUSED_OPS
    for name in dtypes:
        if name not in DTYPES:
            raise SystemExit(f"unknown dtype {name!r}; choose from {sorted(DTYPES)}")
    for op in ops:
        if op not in (*OPS, *FUSED_OPS):
            raise SystemExit(f"unknown op {op!r}; choose from {(*OPS, *FUSED_OPS)}")
    sizes = args.sizes or parse_sizes("1K:256M" if device == "cuda" else "1K:16M")
    return {"device": device, "sizes": sizes, "dtypes": dtypes, "ops": ops,
            "workspace_mb": args.workspace_mb, "table": args.table, "topology": args.allreduce_topology,
            "iter_scale": args.iter_scale, "graph": bool(getattr(args, "graph", False)),
            "check": bool(getattr(args, "check", False)),
            "timing": not getattr(args, "no_timing", False),
            "fault": getattr(args, "inject_fault", None)}


def _spawn(spec: dict, world: int, timeout: float) -> list[dict]:
    from tpserve.engine.tp.launch import spawn_ranks
    from tpserve.tools.bench.collectives_rank import bench_worker
    env = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
           "NVSHMEM_DISABLE_NVLS": "1"}
    return spawn_ranks(bench_worker, world, spec, backend="nccl" if spec["device"] == "cuda"
                       else "gloo", timeout=timeout, env=env)


def _cell(us: Any, nbytes: int, op: str, world: int) -> str:
    if us is None:
        return "-"
    if isinstance(us, str):
        return "error"
    factor = 2 * (world - 1) / world if op.startswith("all_reduce") else (world - 1) / world
    return f"{us:.1f} ({factor * nbytes / (us * 1e-6) / 1e9:.2f})"


def print_rows(rows: list[dict], world: int, device: str, out: Any = None) -> None:
    out = out or sys.stdout
    groups: dict[tuple[str, str], list[dict]] = {}
    for row in rows:
        groups.setdefault((row["op"], row["dtype"]), []).append(row)
    for (op, dtype), items in groups.items():
        names = [b for b in _BACKEND_ORDER if any(b in r["us"] for r in items)]
        header = ["size", *names, "pick", "pick/torch"]
        table = [header]
        for r in items:
            pick_us, torch_us = r["us"].get(r["pick"]), r["us"].get("torch")
            ratio = (f"{torch_us / pick_us:.2f}x" if isinstance(pick_us, float)
                     and isinstance(torch_us, float) else "-")
            table.append([_fmt_bytes(r["bytes"]),
                          *[_cell(r["us"].get(b), r["bytes"], op, world) for b in names],
                          r["pick"], ratio])
        widths = [max(len(row[i]) for row in table) for i in range(len(header))]
        print(f"\n{op} {dtype}, world {world}, {device}: median latency us (bus bandwidth GB/s); "
              f"pick = the size table's choice; pick/torch = speed-up over torch", file=out)
        for row in table:
            print("  ".join(c.rjust(w) for c, w in zip(row, widths)), file=out)
        for r in items:
            for b, us in r["us"].items():
                if isinstance(us, str):
                    print(f"  {_fmt_bytes(r['bytes'])} {b}: {us}", file=out)


def plot_rows(rows: list[dict], path: str, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    ops = list(dict.fromkeys(r["op"] for r in rows))
    fig, axes = plt.subplots(1, len(ops), figsize=(6 * len(ops), 4.5), squeeze=False)
    for ax, op in zip(axes[0], ops):
        items = [r for r in rows if r["op"] == op]
        for dtype in dict.fromkeys(r["dtype"] for r in items):
            for b in _BACKEND_ORDER:
                pts = [(r["bytes"], r["us"][b]) for r in items
                       if r["dtype"] == dtype and isinstance(r["us"].get(b), float)]
                if pts:
                    ax.plot(*zip(*pts), marker="o", ms=3, label=f"{b} {dtype}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("bytes")
        ax.set_ylabel("median latency (us)")
        ax.set_title(op)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _plot(rows: list[dict], path: str, world: int, spec: dict) -> None:
    """`--plot` of bench and tune alike: plot_rows with a title naming the run."""
    mode = " (CUDA graphs)" if spec.get("graph") else ""
    plot_rows(rows, path, f"collectives, world {world}, {spec['device']}{mode}")
    print(f"plot written to {path}")


def run_bench(args: argparse.Namespace) -> int:
    spec = _spec(args)
    started = time.time()
    results = _spawn(spec, args.world, args.timeout)
    failures = [f for r in results for f in r["failures"]]
    rows = results[0]["rows"] or []
    if spec["check"]:
        if failures:
            print(f"CHECK FAILED: {len(failures)} problem(s):")
            for line in failures[:200]:
                print("  " + line)
        else:
            print(f"check passed: every path matches a plain sum (world {args.world}, "
                  f"{spec['device']}, dtypes {','.join(spec['dtypes'])})")
    if rows:
        print_rows(rows, args.world, spec["device"] + (" (CUDA graphs)" if spec["graph"] else ""))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"spec": spec, "rows": rows, "failures": failures}, f, indent=1)
    if args.plot and rows:
        _plot(rows, args.plot, args.world, spec)
    print(f"({time.time() - started:.0f}s)")
    return 1 if failures else 0


def run_tune(args: argparse.Namespace) -> int:
    import datetime

    from tpserve.collectives import tuning
    if args.from_json:
        with open(args.from_json) as f:
            saved = json.load(f)
        spec, rows = saved["spec"], saved["rows"]
        if not rows or any(r["world"] != args.world for r in rows):
            raise SystemExit(f"{args.from_json} holds no timings for --world {args.world}")
    else:
        spec = _spec(args)
        spec["check"], spec["timing"], spec["table"] = False, True, None
        rows = _spawn(spec, args.world, args.timeout)[0]["rows"]
    winners = {}
    for r in rows:
        timed = {b: us for b, us in r["us"].items() if isinstance(us, float)}
        if r["op"] in tuning.FUSED_OPS and tuning.FUSED not in timed:
            continue  # no fused kernel serves this size: nothing to choose
        if timed:
            winners[(r["op"], r["dtype"], tuning.size_bucket(r["bytes"]))] = min(timed, key=timed.get)
    key = tuning.machine_key(spec["device"], args.world, spec.get("topology", "mesh"))
    mode = "CUDA-graph" if spec.get("graph") else "eager"
    meta = {"tuned": True, "key": key,
            "note": f"tuned by `tpserve tune collectives` ({mode} timings) on "
                    f"{datetime.date.today()}", "timings": rows}
    table = tuning.table_from_winners(winners, args.world, tuning.default_table(spec["device"]),
                                      meta)
    path = tuning.write_table(table, args.out or tuning.cache_path(key))
    print_rows(rows, args.world, spec["device"])
    print(f"\ntuned size table written to {path}")
    if args.plot and rows:
        _plot(rows, args.plot, args.world, spec)
    return 0


def main(argv: list[str] | None = None) -> int:
    """`python -m tpserve.tools.bench.collectives bench|tune ...`: the same commands without the rest
    of the tpserve CLI (and its server dependencies), e.g. on a bare GPU image."""
    parser = argparse.ArgumentParser(prog="python -m tpserve.tools.bench.collectives")
    sub = parser.add_subparsers(dest="command", required=True)
    bench = sub.add_parser("bench").add_subparsers(dest="what", required=True)
    tune = sub.add_parser("tune").add_subparsers(dest="what", required=True)
    register(sub, bench, tune)
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("bench", "tune") and (len(argv) == 1 or argv[1] != "collectives"):
        argv.insert(1, "collectives")
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
