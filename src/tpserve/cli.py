"""`tpserve` entry point. Each tool module registers its own subcommands.

A tool module exposes `register(sub, bench, tune)`: `sub` holds the top-level commands
(`tpserve serve ...`), `bench` and `tune` the subcommands of `tpserve bench` / `tpserve tune`.
Each parser sets `func=<callable(args) -> int>`. Modules import heavy packages inside `func`.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

TOOL_MODULES = (
    "tpserve.tools.serve",
    "tpserve.tools.generate",
    "tpserve.tools.make_tiny",
    "tpserve.tools.train_demo",
    "tpserve.tools.doctor",
    "tpserve.tools.bench.collectives",
    "tpserve.tools.bench.serve",
    "tpserve.tools.bench.model",
    "tpserve.tools.bench.spec",
    # operator tools (issue 14)
    "tpserve.tools.smoke",
    "tpserve.tools.bench.prefill_block",
    "tpserve.tools.quality.cli",
    "tpserve.tools.agent_tools",
    "tpserve.tools.bench.fuzz",
    "tpserve.tools.bench.soak",
    "tpserve.tools.quantize",
    "tpserve.tools.snapshot",
    "tpserve.tools.plan",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tpserve", description="Serve GLM-5.3-Flash with tensor parallelism.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    bench = sub.add_parser("bench", help="benchmarks").add_subparsers(dest="bench_command", required=True,
                                                                       metavar="WHAT")
    tune = sub.add_parser("tune", help="tuning").add_subparsers(dest="tune_command", required=True,
                                                                 metavar="WHAT")
    for name in TOOL_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:  # a tool not written yet must not break the others
            if exc.name != name:
                raise
            continue
        module.register(sub, bench=bench, tune=tune)
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=os.environ.get("TPSERVE_LOG_LEVEL", "WARNING"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ValueError, FileNotFoundError) as exc:  # bad settings or paths: one clear line, not a traceback
        logging.getLogger("tpserve").debug("startup failed", exc_info=True)
        parser.exit(2, f"tpserve: error: {exc}\n")


if __name__ == "__main__":
    sys.exit(main())
