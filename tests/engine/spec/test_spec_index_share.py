"""MTP index sharing (`index_share_for_mtp_iteration`, vLLM's reading): the catch-up runs the MTP layer's
indexer; every chained depth skips it and attends over the selection its sequence's last catch-up row had.
Greedy output stays plain decoding's, eagerly and through each padded graph path (run eagerly on CPU)."""

import collections

import pytest
import torch
from spec_cases import PROMPTS, SPEC, Model, pools_full

from tpserve import LLM, SamplingParams

SHARE = {"index_share_for_mtp_iteration": True}
PARAMS = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)


def _spy(llm):
    """Wraps the MTP layer's draft and indexer -> a list of (positions, cu_seqlens, slots, selection passed,
    selection used, indexer calls during the draft) per draft call."""
    mtp = llm.engine.executor.runner.model.mtp
    calls, indexer_calls = [], [0]
    indexer, draft = mtp.self_attn.indexer.forward, mtp.draft

    def count(*a, **kw):
        indexer_calls[0] += 1
        return indexer(*a, **kw)

    def spy(hidden, embedded, batch, cache, selection=None, keep=None):
        before = indexer_calls[0]
        out, used = draft(hidden, embedded, batch, cache, selection, keep)
        calls.append((batch.positions.clone(), list(batch.cu_seqlens), [int(x) for x in batch.slots], selection, used.clone(),
                      indexer_calls[0] - before))
        return out, used

    mtp.self_attn.indexer.forward, mtp.draft = count, spy
    return calls


@pytest.fixture(scope="module")
def want(plain):
    return [o.outputs[0].token_ids for o in plain.generate(PROMPTS, PARAMS)]


def test_config_key_turns_sharing_on_and_is_checked():
    from tpserve.model.config import ModelConfig, UnsupportedConfigError

    assert ModelConfig.from_dict({"model_type": "glm5_next", **SHARE}).index_share_for_mtp_iteration
    assert not ModelConfig.from_dict({"model_type": "glm5_next"}).index_share_for_mtp_iteration
    with pytest.raises((UnsupportedConfigError, ValueError), match="index_share_for_mtp_iteration"):
        ModelConfig.from_dict({"model_type": "glm5_next", "index_share_for_mtp_iteration": "yes"}).validate()


def test_chained_depths_reuse_the_catch_up_selection(want):
    """Eager drafting: a chained depth runs no indexer and attends over exactly the selection of its
    sequence's last catch-up row (nothing at or after the query's position); tokens equal plain decoding's."""
    llm = LLM(Model.path, device="cpu", kv_cache_memory="16MiB", block_size=16, max_num_seqs=8,
              speculative_config=SPEC, hf_overrides=SHARE)
    calls = _spy(llm)
    assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS, PARAMS)] == want
    assert pools_full(llm)
    last = {}  # slot -> (position, selection row) of its sequence's last catch-up row
    depths = 0
    for positions, cu, slots, passed, used, indexed in calls:
        if passed is None:  # a catch-up
            assert indexed == 1
            for i, slot in enumerate(slots):
                last[slot] = (int(positions[cu[i + 1] - 1]), used[cu[i + 1] - 1])
            continue
        depths += 1
        assert indexed == 0, "a chained depth ran the indexer"
        for i, slot in enumerate(slots):
            pos, row = last[slot]
            assert positions[i] > pos and torch.equal(used[i], row)
    assert depths > 20, depths


@pytest.fixture(scope="module")
def shared_run(plain):
    """run(mode): the padded graph path (--draft-graph `mode`, run eagerly on CPU) with index sharing -> (graph
    kinds used, each step's drafts and probabilities, the MTP draft calls (_spy))."""
    from test_spec_graphs import PADDED_PARAMS, PADDED_PROMPTS, _padded_graph_run

    want = [o.outputs[0].token_ids for o in plain.generate(PADDED_PROMPTS, PADDED_PARAMS)]
    runs = {}

    def run(mode: str):
        if mode not in runs:
            calls = []
            used, drafts, _ = _padded_graph_run(plain, mode, want, before=lambda llm: calls.extend([_spy(llm)]),
                                                hf_overrides=SHARE)
            runs[mode] = used, drafts, calls[0]
        return runs[mode]
    return run


@pytest.mark.parametrize("mode", ["depth", "chain", "fused"])
def test_graph_paths_share_the_selection(shared_run, mode):
    """Each padded graph path (tokens checked against plain decoding inside the run): its chained depths run no
    indexer and attend over nothing at or after their position (padding rows, at position 0, aside); per-depth
    steps replay the ("reuse", b, 1) graphs; the chain and the fused steps draft what the per-depth steps draft,
    with the same probabilities up to rounding."""
    used, drafts, calls = shared_run(mode)
    depth_calls = [c for c in calls if c[3] is not None]
    assert len(depth_calls) > 20 and all(c[5] == 0 for c in depth_calls)
    for positions, _, _, _, sel, _ in depth_calls:
        assert ((sel < positions.unsqueeze(1)) | (positions == 0).unsqueeze(1)).all()
    if mode == "depth":
        assert used["reuse", False] and not used["chain", True]
        return
    assert used["chain", True] if mode == "chain" else used["spec", True]
    _, base, _ = shared_run("depth" if mode == "chain" else "chain")
    assert [[(r, d) for r, d, _ in step] for step in drafts] == [[(r, d) for r, d, _ in step] for step in base]
    gap = max(abs(x - y) for s1, s2 in zip(drafts, base) for a, b in zip(s1, s2) for x, y in zip(a[2], b[2]))
    assert gap < 1e-5, gap
