"""What the speculative-decoding tests share: the settings, prompts and checks."""

from tpserve import LLM

# a fixed k (drafts truncated by probability only): the adaptive mode's measured step rates depend on
# the machine's timing, and tests that need drafts pending must not depend on it
SPEC = {"method": "mtp", "num_speculative_tokens": 3, "adaptive": False}
PROMPTS = ["Count from 1 to 30: 1, 2, 3,", "The capital of France is", "def fibonacci(n):",
           "Q: What is 12 + 7?\nA:"]
LOGPROB_TOL = 5e-4


class Model:
    """The checkpoint every engine here loads: a tiny one with an MTP layer in the published layout whose drafts
    are often accepted (tests/helpers.py "mtp"); set by conftest.py."""
    path = ""


def pools_full(llm) -> bool:
    e = llm.engine
    return e.block_pool.num_free == e.block_pool.num_blocks and e.slot_pool.num_free == e.slot_pool.num_blocks


def fused_llm(spec=SPEC, **kw):
    """An engine whose steps go through the padded graph path with fused speculative steps, run eagerly."""
    llm = LLM(Model.path, device="cpu", block_size=16, speculative_config=spec, **{"kv_cache_memory": "16MiB",
                                                                        "max_num_seqs": 8, **kw})
    seqs = llm.engine.ecfg.max_num_seqs
    llm.engine.executor.runner.setup_graphs(seqs, None, enforce_eager=False, pad_on_cpu=True,
                                            num_speculative_tokens=3, draft_graph="fused")
    fused = []
    spec_step = llm.engine.executor.runner.graphs.spec_step
    llm.engine.executor.runner.graphs.spec_step = lambda plan, key, *rest: fused.append(key) or spec_step(plan, key,
                                                                                                           *rest)
    return llm, fused
