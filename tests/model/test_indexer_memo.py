"""The indexer's batch-only index tensors (pool rows, visibility, the tail) are computed once per
forward and shared by every MLA layer, and doing so changes no token."""

import torch

from tpserve import LLM, SamplingParams
from tpserve.model.batch import ForwardBatch
from tpserve.model.glm5_next import Glm5NextModel
from tpserve.model.indexer import Indexer

PARAMS = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
PROMPTS = [{"prompt_token_ids": list(range(3, 40))}, {"prompt_token_ids": list(range(50, 61))}]


def _generate(path, monkeypatch, memo: bool):
    calls = {"forward": 0, "fill": 0, "select": 0}
    if not memo:
        monkeypatch.setattr(ForwardBatch, "memoized", lambda self, key, compute: compute())
    for name, attr in (("fill", "_fill_rows"), ("select", "_select_rows")):
        original = getattr(Indexer, attr)

        def counted(self, *a, _original=original, _name=name, **kw):
            calls[_name] += 1
            return _original(self, *a, **kw)
        monkeypatch.setattr(Indexer, attr, counted)
    forward = Glm5NextModel.forward_hidden

    def counted_forward(self, *a, **kw):
        calls["forward"] += 1
        return forward(self, *a, **kw)
    monkeypatch.setattr(Glm5NextModel, "forward_hidden", counted_forward)
    llm = LLM(str(path), device="cpu", kv_cache_memory="64MiB", block_size=16, max_num_batched_tokens=16)
    try:
        tokens = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, PARAMS)]
    finally:
        llm.shutdown()
    monkeypatch.undo()
    return tokens, calls


def test_every_mla_layer_shares_one_computation_per_forward(tiny, monkeypatch):
    path = tiny("default")  # two MLA layers with a full indexer each
    tokens, calls = _generate(path, monkeypatch, memo=True)
    plain_tokens, plain_calls = _generate(path, monkeypatch, memo=False)
    assert tokens == plain_tokens
    assert calls["forward"] == plain_calls["forward"] > 0
    assert calls["fill"] == calls["forward"] and plain_calls["fill"] == 2 * calls["forward"]
    assert 0 < calls["select"] < plain_calls["select"] == 2 * calls["select"]


def test_the_memo_is_emptied_at_every_forward():
    batch = ForwardBatch(input_ids=torch.zeros(1, dtype=torch.long), positions=torch.zeros(1, dtype=torch.long),
                         cu_seqlens=[0, 1], context_lens=[0], slots=torch.zeros(1, dtype=torch.long),
                         block_tables=torch.zeros(1, 1, dtype=torch.long), slot_mapping=torch.zeros(1, dtype=torch.long),
                         logits_indices=torch.zeros(1, dtype=torch.long))
    assert batch.memoized(("k",), lambda: 1) == 1
    assert batch.memoized(("k",), lambda: 2) == 1  # the same forward: the first value
    seen = []

    class Stop(Exception):
        pass

    class Model:
        def embed(self, ids, b):
            seen.append(dict(b.memo))
            raise Stop

    try:
        Glm5NextModel.forward_hidden.__wrapped__(Model(), batch, None)
    except Stop:
        pass
    assert seen == [{}]
