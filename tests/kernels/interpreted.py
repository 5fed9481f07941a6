"""Run code that calls our Triton kernels under Triton's CPU interpreter, in a child process.

Triton decides at import time whether kernels (its own `tl` helpers too) are interpreted, so the
child starts with TRITON_INTERPRET=1 before anything imports triton. Skipped where Triton is not
installed (CI installs none: with triton importable, transformers would send its reference model
through fla-core's GPU kernels, which cannot run on a CPU).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest


def run_interpreted(code: str, timeout: float = 600) -> dict:
    """Run `code` (which must print one JSON object as its last line) with the interpreter on."""
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                          timeout=timeout)
    if proc.returncode:
        raise AssertionError(f"interpreted run failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])
