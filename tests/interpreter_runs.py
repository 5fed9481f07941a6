"""The child pytest runs of test_interpreter_suite.py, one file at a time in a background thread.

conftest.py starts them once the suite is collected and moves their tests to the end: the children (single
threaded, minutes each) then use the core the main run leaves idle, and the tests only collect the results.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 600  # seconds a child run may take

_pool: ThreadPoolExecutor | None = None
_runs: dict[str, Future] = {}
_live: set[subprocess.Popen] = set()
_lock = threading.Lock()


def triton_path() -> str | None:
    """The PYTHONPATH holding Triton for the children, or None where they do not run (see the suite)."""
    path = os.environ.get("TPSERVE_TEST_TRITON_PATH")
    return path if path and importlib.util.find_spec("triton") is None else None


def start(files: list[str]) -> None:
    """Queue a child run of each file not queued yet (nothing where triton_path() is None)."""
    global _pool
    path = triton_path()
    if path is None:
        return
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="interpreter-suite")
        for f in files:
            if f not in _runs:
                _runs[f] = _pool.submit(_run, f, path)


def result(file: str) -> subprocess.CompletedProcess:
    """The child run of `file` (queued now if it was not), waited for."""
    start([file])
    return _runs[file].result()


def stop() -> None:
    """End the children still running and drop the queued ones (the session is over)."""
    with _lock:
        for fut in _runs.values():
            fut.cancel()
        for proc in list(_live):
            proc.kill()


def _run(file: str, path: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (path, os.environ.get("PYTHONPATH")) if p)}
    argv = [sys.executable, "-m", "pytest", "-rs", "-p", "no:cacheprovider", file]
    with subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        _live.add(proc)
        try:
            out, err = proc.communicate(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            err += f"\n(killed after {TIMEOUT} s)"
        finally:
            _live.discard(proc)
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)
