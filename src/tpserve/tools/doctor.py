"""`tpserve doctor [--pid PID] [--root DIR] [--json]`: check the host and running tpserve
processes for silent slowdowns (GPU/NUMA placement of NCCL buffers, NCCL_CUMEM_ENABLE).
The checks and their rules are in `tpserve.tools.doctor_checks`. Exit code: 0 healthy, 1 warnings,
2 failures.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path


def _pid(text: str) -> int:
    try:
        pid = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a process id: {text!r}") from None
    if pid <= 0:
        raise argparse.ArgumentTypeError(f"a process id is positive, got {pid}")
    return pid


def _directory(text: str) -> Path:
    path = Path(text)
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"not a directory: {text}")
    return path


def register(sub, bench, tune) -> None:
    parser = sub.add_parser("doctor", help="check GPUs, NUMA placement and NCCL settings",
                            description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pid", type=_pid, default=None,
                        help="check this process (default: every running tpserve process)")
    parser.add_argument("--root", type=_directory, default=None, metavar="DIR",
                        help="read proc/ and sys/ under DIR (a captured tree); NVML is not queried")
    parser.add_argument("--json", action="store_true", help='print {"checks": [...]} as JSON')
    parser.set_defaults(func=run)


def format_text(checks) -> str:
    """The checks as aligned columns, then a one-line verdict."""
    from tpserve.tools.doctor_checks import FAIL, WARN, exit_code

    width = max([len("CHECK")] + [len(c.name) for c in checks])
    lines = [f"{'STATUS':<6}  {'CHECK':<{width}}  DETAIL"]
    lines += [f"{c.status:<6}  {c.name:<{width}}  {c.detail}" for c in checks]
    code = exit_code(checks)
    warns = sum(c.status == WARN for c in checks)
    fails = sum(c.status == FAIL for c in checks)
    verdict = ("healthy", f"{warns} warning(s)", f"{fails} failure(s), {warns} warning(s)")[code]
    return "\n".join(lines + [f"result: {verdict} (exit {code})"])


def run(args: argparse.Namespace) -> int:
    from tpserve.tools.doctor_checks import exit_code, run_doctor

    if args.root is None:
        checks = run_doctor(Path("/"), pid=args.pid, nvml=True, exclude=(os.getpid(),))
    else:
        checks = run_doctor(args.root, pid=args.pid, nvml=False)
    if args.json:
        print(json.dumps({"checks": [c.to_dict() for c in checks]}, indent=2))
    else:
        print(format_text(checks))
    return exit_code(checks)
