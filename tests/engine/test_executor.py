from tpserve.engine.executor import cuda_cache_budget
from tpserve.model.plan import ACTIVATION_RESERVE

GiB = 2**30


def test_share_ignores_other_processes():
    # 80 GiB card, 0.45 each: the second engine gets the same cache as the first, though the first holds 36 GiB.
    first = cuda_cache_budget(80 * GiB, 79 * GiB, 10 * GiB, 0.45)
    second = cuda_cache_budget(80 * GiB, 43 * GiB, 10 * GiB, 0.45)
    assert first == second == 26 * GiB - ACTIVATION_RESERVE


def test_free_memory_caps_the_share():
    assert cuda_cache_budget(80 * GiB, 20 * GiB, 10 * GiB, 0.85) == 20 * GiB - ACTIVATION_RESERVE
