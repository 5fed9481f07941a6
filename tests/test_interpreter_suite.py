"""The Triton-interpreter tests, run where the test environment itself has no Triton (CI).

Triton must stay out of the test environment (with it importable, transformers sends its reference
model through fla-core's GPU kernels and the oracle tests fail on a CPU), so the tests that run our
GPU kernels in Triton's CPU interpreter skip there. `TPSERVE_TEST_TRITON_PATH` names a PYTHONPATH
holding Triton (and a numpy its interpreter accepts), installed aside (`.ci/run` does:
`pip install --target`); each of those files then runs in its own child pytest with it
(interpreter_runs.py: started in the background once the suite is collected, these tests run last),
and a test here fails if any test there fails or skips. Skipped where the variable is unset, or where
Triton is importable here (the interpreter tests then run directly in this pytest run).
"""

from __future__ import annotations

import importlib.util
import os
import re

import pytest
from interpreter_runs import ROOT, result

# the GPU kernels proven in the interpreter: the workspace collectives (one-round, pipelined, fused,
# the MoE fold, the ring) and the quantized GEMMs; the attention kernels' specializations (CUDA binder); fla-core's
# recurrent KDA kernel as the short-prefill path
INTERPRETED = ("tests/collectives/test_peer_workspace_interpreter.py", "tests/collectives/test_moe_combine_rs_interpreter.py",
               "tests/collectives/test_peer_workspace_ring_interpreter.py", "tests/kernels/quant/test_quant_triton.py",
               "tests/kernels/attention/test_specialization.py", "tests/kernels/attention/test_kda_fla_interpreter.py")


@pytest.mark.timeout(1300)  # the child's own limit is 600 s; it may wait for the one queued before it
@pytest.mark.parametrize("file", INTERPRETED)
def test_the_interpreter_tests_pass_with_triton_installed_aside(file):
    if not os.environ.get("TPSERVE_TEST_TRITON_PATH"):
        pytest.skip("TPSERVE_TEST_TRITON_PATH unset (CI sets it: .ci/run)")
    if importlib.util.find_spec("triton") is not None:
        pytest.skip("Triton is importable here: the interpreter tests ran directly")
    assert (ROOT / file).is_file(), file
    proc = result(file)
    tail = proc.stdout[-6000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, tail
    summary = proc.stdout.strip().splitlines()[-1]
    passed = re.search(r"(\d+) passed", summary)
    assert passed and int(passed.group(1)) >= 2, tail
    assert "skipped" not in summary, tail
