"""CLI plumbing shared by the tools: EngineConfig flags generated from its field metadata."""

from __future__ import annotations

import argparse
import dataclasses

from tpserve.config import BYTE_FIELDS, EngineConfig


def add_engine_args(parser: argparse.ArgumentParser, *, model_positional: bool = True) -> None:
    """Every EngineConfig field as a flag (defaults None, so TPSERVE_* variables still apply)."""
    group = parser.add_argument_group("engine")
    for f in dataclasses.fields(EngineConfig):
        if f.name == "model":
            if model_positional:
                parser.add_argument("model", nargs="?", default=None, help=f.metadata["help"])
            group.add_argument("--model", dest="model_flag", default=None, help=argparse.SUPPRESS
                               if model_positional else f.metadata["help"])
            continue
        flag = EngineConfig.flag_name(f)
        kind = f.type if isinstance(f.type, str) else str(f.type)
        kwargs = dict(dest=f.name, default=None, help=f"{f.metadata['help']} (default: {f.default})")
        if kind.startswith("bool"):
            group.add_argument(flag, action=argparse.BooleanOptionalAction, **kwargs)
            continue
        if f.metadata.get("choices"):
            kwargs["choices"] = f.metadata["choices"]
        elif kind.startswith("int"):
            kwargs["type"] = int
        elif kind.startswith("float") and f.name not in BYTE_FIELDS:
            kwargs["type"] = float
        aliases = [flag] + (["--tensor-parallel-size"] if f.name == "tensor_parallel_size" else [])
        group.add_argument(*aliases, **kwargs)


def engine_config_from_args(args: argparse.Namespace) -> EngineConfig:
    values = {f.name: getattr(args, f.name, None) for f in dataclasses.fields(EngineConfig)}
    values["model"] = getattr(args, "model", None) or getattr(args, "model_flag", None)
    return EngineConfig.from_env(**values)
