"""Merged linears (model/merged.py): linears sharing an input run as one GEMM over stacked weights."""

import torch

from helpers import random_prompts
from tpserve import LLM, SamplingParams


def _llm(path, **kw):
    return LLM(str(path), device="cpu", kv_cache_memory="8MiB", block_size=16, skip_tokenizer_init=True, **kw)


def _stacked(model):
    return {n: p for n, p in model.named_parameters() if n.endswith(("qkv_weight", "fgb_a_weight", "gate_up_weight",
                                                                       "qkv_a_weight"))}


def test_merged_weights_are_the_members_rows_and_tokens_equal(tiny, monkeypatch):
    path = tiny("default")
    on, off = _llm(path), _llm(path, merge_linears=False)
    m_on, m_off = on.engine.executor.runner.model, off.engine.executor.runner.model
    stacked = _stacked(m_on)
    kinds = {n.rsplit(".", 1)[1] for n in stacked}
    assert kinds == {"qkv_weight", "fgb_a_weight", "gate_up_weight", "qkv_a_weight"} and not _stacked(m_off)
    # nothing held twice: the same parameter count, each member's weight a view of its rows of the stack
    assert sum(p.numel() for p in m_on.parameters()) == sum(p.numel() for p in m_off.parameters())
    params_off = dict(m_off.named_parameters())
    for name, w in stacked.items():
        mod = m_on.get_submodule(name.rsplit(".", 1)[0])
        group = name.rsplit(".", 1)[1][:-len("_weight")]
        row = 0
        for member in mod.merged_linears[group]:
            part = getattr(mod, member).weight
            assert part.data_ptr() == w.data_ptr() + row * w.stride(0) * w.element_size()
            assert torch.equal(part, params_off[f"{name.rsplit('.', 1)[0]}.{member}.weight"])
            row += part.shape[0]
        assert row == w.shape[0]
    prompts = [{"prompt_token_ids": p} for p in random_prompts((17, 40, 5), seed=12)]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    want = [o.outputs[0].token_ids for o in off.generate(prompts, params)]
    assert [o.outputs[0].token_ids for o in on.generate(prompts, params)] == want
    from tpserve.model import merged

    monkeypatch.setattr(merged, "STACKED_MAX_ROWS", 4)  # prefill chunks: the members apart, on the stack's rows
    assert [o.outputs[0].token_ids for o in on.generate(prompts, params)] == want


def test_snapshot_stores_the_stack_and_relinks_the_members(tiny, tmp_path):
    """A snapshot written with merging holds the stacked weight (not the members'); a boot from it points the
    members at its rows again and gives the same tokens."""
    from safetensors import safe_open

    path = tiny("default")
    prompts = [{"prompt_token_ids": p} for p in random_prompts((23, 9), seed=3)]
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    runs = []
    for _ in range(2):  # the first boot writes the snapshot, the second restores it
        llm = _llm(path, snapshot=True, snapshot_dir=str(tmp_path))
        model = llm.engine.executor.runner.model
        attn = model.layers[0].self_attn
        assert attn.q_proj.weight.data_ptr() == attn.qkv_weight.data_ptr()
        runs.append([o.outputs[0].token_ids for o in llm.generate(prompts, params)])
    assert runs[0] == runs[1]
    names = set()
    for part in tmp_path.rglob("*.safetensors"):
        with safe_open(str(part), "pt") as f:
            names |= set(f.keys())
    assert "layers.0.self_attn.qkv_weight" in names and "layers.0.self_attn.q_proj.weight" not in names
