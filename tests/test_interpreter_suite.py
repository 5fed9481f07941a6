"""The Triton-interpreter tests, run where the test environment itself has no Triton (CI).

Triton must stay out of the test environment (with it importable, transformers sends its reference
model through fla-core's GPU kernels and the oracle tests fail on a CPU), so the tests that run our
GPU kernels in Triton's CPU interpreter skip there. `TPSERVE_TEST_TRITON_PATH` names a PYTHONPATH
holding Triton (and a numpy its interpreter accepts), installed aside (`.ci/run` does:
`pip install --target`); this test then runs each of those files in its own child pytest with it
and fails if any test there fails or skips. Skipped where the variable is unset, or where Triton is
importable here (the interpreter tests then run directly in this pytest run).
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# the GPU kernels proven in the interpreter: the workspace collectives (one-round, pipelined, fused,
# the MoE fold, the ring) and the quantized GEMMs
INTERPRETED = ("tests/collectives/test_peer_workspace_interpreter.py", "tests/collectives/test_moe_combine_rs_interpreter.py",
               "tests/collectives/test_peer_workspace_ring_interpreter.py", "tests/kernels/quant/test_quant_triton.py")


@pytest.mark.timeout(700)  # the child pytest's own limit is 600 s
@pytest.mark.parametrize("file", INTERPRETED)
def test_the_interpreter_tests_pass_with_triton_installed_aside(file):
    path = os.environ.get("TPSERVE_TEST_TRITON_PATH")
    if not path:
        pytest.skip("TPSERVE_TEST_TRITON_PATH unset (CI sets it: .ci/run)")
    if importlib.util.find_spec("triton") is not None:
        pytest.skip("Triton is importable here: the interpreter tests ran directly")
    assert (ROOT / file).is_file(), file
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (path, os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-rs", "-p", "no:cacheprovider", file],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    tail = proc.stdout[-6000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, tail
    summary = proc.stdout.strip().splitlines()[-1]
    passed = re.search(r"(\d+) passed", summary)
    assert passed and int(passed.group(1)) >= 2, tail
    assert "skipped" not in summary, tail
