import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from spec_cases import SPEC, Model  # noqa: E402

from tpserve import LLM  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def _model(tiny):
    Model.path = str(tiny("mtp"))


@pytest.fixture(scope="session")
def plain():
    """The tiny MTP checkpoint without speculation: the reference tokens."""
    return LLM(Model.path, device="cpu", kv_cache_memory="16MiB", block_size=16, max_num_seqs=8)


@pytest.fixture(scope="session")
def spec():
    return LLM(Model.path, device="cpu", kv_cache_memory="16MiB", block_size=16, max_num_seqs=8, speculative_config=SPEC)
