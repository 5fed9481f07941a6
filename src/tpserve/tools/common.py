"""CLI plumbing shared by the tools: EngineConfig flags generated from its field metadata.

Fields marked `advanced` (the kernel and speedup switches) are always accepted, but their help
prints only with `--help-all`, so `--help` shows what a user usually sets.
"""

from __future__ import annotations

import argparse
import dataclasses

from tpserve.config import BYTE_FIELDS, EngineConfig

ADVANCED_TITLE = "advanced: kernel and speedup switches (docs/switches.md)"
_METAVARS = {"kv_cache_memory": "BYTES", "prefix_state_memory": "BYTES", "speculative_config": "JSON", "hf_overrides": "JSON",
             "collective_table": "FILE", "snapshot_dir": "DIR", "quantization": "METHOD"}


class HelpAll(argparse.Action):
    """`--help-all`: the help with the advanced group shown, then exit."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        for action in parser._actions:
            if hasattr(action, "full_help"):
                action.help = action.full_help
        parser.print_help()
        parser.exit()


def add_help_all(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--help-all", action=HelpAll, help="show every option, the advanced switches too")


def add_engine_args(parser: argparse.ArgumentParser, *, model_positional: bool = True) -> None:
    """Every EngineConfig field as a flag (defaults None, so TPSERVE_* variables still apply)."""
    if parser.usage is None:
        parser.usage = "%(prog)s " + ("[model] " if model_positional else "") + "[options]"
    if parser.epilog is None:
        parser.epilog = "Engine options also read TPSERVE_<OPTION> variables, e.g. TPSERVE_MAX_NUM_SEQS=8."
    add_help_all(parser)
    group = parser.add_argument_group("engine")
    advanced = parser.add_argument_group(ADVANCED_TITLE)
    for f in dataclasses.fields(EngineConfig):
        text = f.metadata["help"]
        if f.name == "model":
            if model_positional:
                parser.add_argument("model", nargs="?", default=None, help=text)
            group.add_argument("--model", dest="model_flag", default=None, metavar="DIR",
                               help=argparse.SUPPRESS if model_positional else text)
            continue
        flag = EngineConfig.flag_name(f)
        kind = f.type if isinstance(f.type, str) else str(f.type)
        if "default" not in text:
            text = f"{text} (default: {f.default})"
        kwargs = dict(dest=f.name, default=None, help=text)
        target = advanced if f.metadata.get("advanced") else group
        if kind.startswith("bool"):
            action = target.add_argument(flag, action=argparse.BooleanOptionalAction, **kwargs)
        else:
            if f.metadata.get("choices"):
                kwargs["choices"] = f.metadata["choices"]
            else:
                kwargs["metavar"] = _METAVARS.get(f.name, "N" if kind.startswith("int") else
                                                  "X" if kind.startswith("float") else "TEXT")
                if kind.startswith("int"):
                    kwargs["type"] = int
                elif kind.startswith("float") and f.name not in BYTE_FIELDS:
                    kwargs["type"] = float
            aliases = [flag] + (["--tensor-parallel-size"] if f.name == "tensor_parallel_size" else [])
            action = target.add_argument(*aliases, **kwargs)
        if target is advanced:
            action.full_help, action.help = text, argparse.SUPPRESS


def engine_config_from_args(args: argparse.Namespace) -> EngineConfig:
    values = {f.name: getattr(args, f.name, None) for f in dataclasses.fields(EngineConfig)}
    values["model"] = getattr(args, "model", None) or getattr(args, "model_flag", None)
    return EngineConfig.from_env(**values)
