import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent / "server"))

from fakes import fault_proxy, good_answers, script  # noqa: E402
from live import LiveServer  # noqa: E402


@pytest.fixture(scope="session")
def live(tiny):
    """The CPU tiny model behind the real server (random answers)."""
    s = LiveServer(str(tiny("default")), max_num_batched_tokens=64)
    yield s
    s.close()


@pytest.fixture(scope="session")
def scripted(tiny):
    """The tiny server, with the smoke checks' and quality tasks' prompts answered as a good model would."""
    s = LiveServer(str(tiny("default")))
    script(s, good_answers)
    yield s
    s.close()


@pytest.fixture(scope="session")
def faulty(live):
    proxies = {}

    def get(fault):
        if fault not in proxies:
            proxies[fault] = fault_proxy(live.url, fault)
        return proxies[fault]

    yield get
    for p in proxies.values():
        p.close()
