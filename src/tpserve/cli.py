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


class CommandListFormatter(argparse.HelpFormatter):
    """Command lists one line each: argparse measures subcommand names two columns short of where it prints them."""

    def add_argument(self, action: argparse.Action) -> None:
        super().add_argument(action)
        if isinstance(action, argparse._SubParsersAction) and action.choices:
            width = max(map(len, action.choices)) + self._current_indent + 2
            self._action_max_length = max(self._action_max_length, width)


def _print_help(parser: argparse.ArgumentParser):
    """A parser's `func` for bare `tpserve` / `tpserve bench`: its help, exit code 0."""
    return lambda args: parser.print_help() or 0


def build_parser() -> argparse.ArgumentParser:
    from tpserve import __version__

    parser = argparse.ArgumentParser(prog="tpserve", formatter_class=CommandListFormatter,
                                     description="Serve GLM-5.3-Flash (glm5_next) with tensor parallelism.",
                                     epilog="`tpserve COMMAND --help` for a command's options. README.md, "
                                            "docs/architecture.md.")
    parser.add_argument("--version", action="version", version=f"tpserve {__version__}")
    parser.set_defaults(func=_print_help(parser))
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    groups = {}
    for name, text in (("bench", "benchmarks: serve, model, spec, collectives, fuzz, soak, ..."),
                       ("tune", "tune the collectives' size table")):
        p = sub.add_parser(name, help=text, description=text, formatter_class=CommandListFormatter)
        p.set_defaults(func=_print_help(p))
        groups[name] = p.add_subparsers(dest=f"{name}_command", metavar="WHAT")
    for name in TOOL_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:  # a tool not written yet must not break the others
            if exc.name != name:
                raise
            continue
        module.register(sub, bench=groups["bench"], tune=groups["tune"])
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
