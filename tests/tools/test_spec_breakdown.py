"""bench/spec_breakdown.py: the phases it charges add up to no more than the steps they ran in, and
every phase of a speculative step is seen."""

from __future__ import annotations

import pytest
from helpers import load_bench


@pytest.mark.timeout(300)
def test_breakdown_phases_fit_inside_the_steps(tiny):
    from tpserve import LLM, SamplingParams
    from tpserve.tools.acceptance import mtp_prompts

    bd = load_bench("spec_breakdown")
    prompts = mtp_prompts()[:2]
    sp = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    for spec in (None, {"method": "mtp", "num_speculative_tokens": 2, "adaptive": False}):
        llm = LLM(str(tiny("mtp")), device="cpu", speculative_config=spec, max_num_seqs=4,
                  kv_cache_memory=64 * 2**20)
        try:
            res = bd.breakdown(llm, prompts, sp, "cpu")
            again = bd.breakdown(llm, prompts, sp, "cpu")  # wrappers removed: a second run works the same
            prefill = bd.breakdown(llm, prompts, sp, "cpu", prefill_steps=True)
            table = bd.profile_steps(llm, prompts, sp, True, 5)
            assert "schedule" not in vars(llm.engine.scheduler) and "step" not in vars(llm.engine)
        finally:
            llm.shutdown()
        ph = res["phases"]
        assert res["steps"] > 0 and res["tokens"] >= res["steps"] * len(prompts)
        assert again["tokens"] == res["tokens"]
        # the prompts' one prefill step (its first token each), then the profiled one's operators
        assert prefill["steps"] == 1 and prefill["tokens"] == len(prompts) and prefill["phases"]["execute"] > 0
        assert (spec is None) == ("draft" not in prefill["phases"]) and "aten::" in table
        own = sum(v for p, v in ph.items() if p not in ("step", "draft"))  # draft runs inside propose
        assert 0 < own <= ph["step"]
        assert ph["execute"] > 0
        if spec is None:
            assert ph["sample"] > 0 and "draft" not in ph
        else:
            assert ph["draft"] > 0 and ph["verify"] > 0 and ph["draft"] <= ph["propose"]
            assert res["tokens"] > res["steps"] * len(prompts)  # drafts were accepted
