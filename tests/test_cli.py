"""The `tpserve` front door: bare command, --version, short help, --help-all, help string lengths."""

import argparse
import dataclasses
import subprocess
import sys

import pytest

import tpserve
from tpserve.cli import build_parser, main
from tpserve.config import EngineConfig


def _run(capsys, monkeypatch, argv):
    monkeypatch.setenv("COLUMNS", "80")
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    return exit_info.value.code, capsys.readouterr()


def _help_lines(capsys, monkeypatch, argv):
    code, out = _run(capsys, monkeypatch, argv)
    assert code == 0, out.err
    return out.out.splitlines()


def test_bare_tpserve_prints_help_and_exits_zero():
    out = subprocess.run([sys.executable, "-m", "tpserve.cli"], capture_output=True, text=True,
                         env={"COLUMNS": "80", "PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path)})
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("usage: tpserve")
    for command in ("serve", "generate", "bench", "smoke", "quality", "doctor", "quantize", "plan"):
        line = next(x for x in lines if x.split()[:1] == [command])
        assert len(line.split()) > 1, f"{command}: its one-line description is missing or wrapped"


def test_bare_bench_prints_its_commands(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["bench"]) == 0
    text = capsys.readouterr().out
    assert all(f"    {name} " in text for name in ("serve", "model", "spec", "collectives"))


def test_version(capsys, monkeypatch):
    code, out = _run(capsys, monkeypatch, ["--version"])
    assert code == 0 and out.out.strip() == f"tpserve {tpserve.__version__}"


def test_serve_help_is_short_and_help_all_shows_every_switch(capsys, monkeypatch):
    short = _help_lines(capsys, monkeypatch, ["serve", "--help"])
    assert len(short) <= 120, len(short)
    text = "\n".join(short)
    for flag in ("--tp", "--max-model-len", "--gpu-memory-utilization", "--dtype", "--quantization",
                 "--speculative-config", "--host", "--port", "--api-key", "--served-model-name", "--help-all"):
        assert flag in text, flag
    assert "--gemv-backend" not in text and "--pdl" not in text
    full = "\n".join(_help_lines(capsys, monkeypatch, ["serve", "--help-all"]))
    for f in dataclasses.fields(EngineConfig):
        if f.name != "model":
            assert EngineConfig.flag_name(f) in full, f.name
    assert "advanced: kernel and speedup switches" in full


def test_hidden_switches_are_still_accepted():
    args = build_parser().parse_args(["serve", "--gemv-backend", "torch", "--no-merge-linears", "--pdl", "off"])
    assert (args.gemv_backend, args.merge_linears, args.pdl) == ("torch", False, "off")


def test_advanced_fields_are_switches():
    for f in dataclasses.fields(EngineConfig):
        if f.metadata["advanced"]:
            assert f.metadata["switch"] or f.name == "tokenizer_cache_words", f.name


def _all_help(parser, path):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _all_help(sub, path + [name])
            for choice in action._choices_actions:
                yield path + [choice.dest], choice.help
        else:
            text = getattr(action, "full_help", action.help)
            if text and text != argparse.SUPPRESS:
                yield path + [action.dest], text


def test_no_help_string_runs_long():
    long = [(" ".join(path), len(text)) for path, text in _all_help(build_parser(), ["tpserve"]) if len(text) > 200]
    assert not long, long
