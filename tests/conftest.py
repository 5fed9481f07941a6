import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

from helpers import make_checkpoint  # noqa: E402

# One intra-op thread (unless OMP_NUM_THREADS says otherwise), here and in the processes the tests start
# (TP ranks, servers): the tiny models' ops are too small to gain from more, and a parallel region stalls
# whenever a core it waits for is busy with another of these processes.
os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
# TP ranks and workers start as forks of a server that imported torch and the engine once (engine/tp/launch.py
# `mp_context`): milliseconds a rank instead of seconds
os.environ.setdefault("TPSERVE_MP_START", "forkserver")


@pytest.fixture(scope="session")
def tiny_root(tmp_path_factory):
    return tmp_path_factory.mktemp("tiny")


@pytest.fixture(scope="session")
def tiny(tiny_root):
    """name -> checkpoint dir, made on first use."""
    made = {}

    def get(name: str = "default") -> Path:
        if name not in made:
            made[name] = make_checkpoint(tiny_root, name)
        return made[name]

    return get


@pytest.fixture(scope="session", autouse=True)
def isolated_cache(tmp_path_factory):
    """The built-in tiny model goes to a temporary cache dir, not the user's."""
    import os

    os.environ.setdefault("TPSERVE_CACHE_DIR", str(tmp_path_factory.mktemp("tpserve-cache")))


def pytest_collection_modifyitems(session, config, items):
    """The interpreter suite's child runs start now, in the background, and its tests go last
    (interpreter_runs.py)."""
    last = [i for i in items if Path(str(i.fspath)).name == "test_interpreter_suite.py"]
    if not last:
        return
    items[:] = [i for i in items if i not in last] + last
    from interpreter_runs import start

    start([i.callspec.params["file"] for i in last if hasattr(i, "callspec")])


def pytest_sessionfinish(session, exitstatus):
    from interpreter_runs import stop

    stop()
