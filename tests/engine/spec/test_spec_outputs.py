"""Speculative decoding with the MTP drafter on a tiny published-layout MTP checkpoint: its outputs against
plain decoding.

Greedy output with speculation equals output without it, token for token; logprobs agree within
fp32 reassociation (the verify step multiplies 1+k rows where plain decoding multiplies one, so
GEMM blocking may round differently: the bound is ~100x the differences seen on CPU, far
below any change of token). Pools are full after finishes, stops and aborts inside accepted runs.
"""

import dataclasses

import pytest
import torch
from spec_cases import LOGPROB_TOL, PROMPTS, SPEC, Model, pools_full

from tpserve import LLM, SamplingParams
from tpserve.config import EngineConfig
from tpserve.engine.scheduler import Scheduled


def test_greedy_identical_tokens_and_logprobs(plain, spec):
    sp = SamplingParams(temperature=0, max_tokens=40, logprobs=2, ignore_eos=True)
    a, b = plain.generate(PROMPTS, sp), spec.generate(PROMPTS, sp)
    for x, y in zip(a, b):
        assert y.outputs[0].token_ids == x.outputs[0].token_ids
        for lx, ly in zip(x.outputs[0].logprobs, y.outputs[0].logprobs):
            assert lx.keys() == ly.keys()
            assert max(abs(lx[t].logprob - ly[t].logprob) for t in lx) < LOGPROB_TOL
    stats = spec.engine.stats()
    assert stats["spec_decode_num_drafts"] > 0
    assert 0 < stats["spec_decode_num_accepted_tokens"] <= stats["spec_decode_num_draft_tokens"]
    per_pos = stats["spec_decode_num_accepted_tokens_per_pos"]
    assert len(per_pos) == 3 and per_pos[0] >= per_pos[1] >= per_pos[2] and sum(per_pos) == \
        stats["spec_decode_num_accepted_tokens"]
    assert pools_full(spec)


def test_stops_inside_accepted_runs_and_lengths(plain, spec):
    """A stop token, a stop string and max_tokens hit inside a run of accepted drafts: nothing after
    them is emitted and the outputs equal plain decoding's."""
    base = plain.generate(PROMPTS[:1], SamplingParams(temperature=0, max_tokens=30))[0].outputs[0]
    stop_tok = base.token_ids[9]
    cases = [SamplingParams(temperature=0, max_tokens=30, stop_token_ids=[stop_tok]),
             SamplingParams(temperature=0, max_tokens=30, stop=[base.text[12:16]]),
             SamplingParams(temperature=0, max_tokens=7),
             SamplingParams(temperature=0, max_tokens=30, n=2)]
    for sp in cases:
        x, y = plain.generate(PROMPTS[:1], sp)[0], spec.generate(PROMPTS[:1], sp)[0]
        assert [o.token_ids for o in y.outputs] == [o.token_ids for o in x.outputs]
        assert [o.text for o in y.outputs] == [o.text for o in x.outputs]
        assert [o.finish_reason for o in y.outputs] == [o.finish_reason for o in x.outputs]
    assert pools_full(spec)
    assert spec.engine.speculator.policy.snapshot()["requests_tracked"] == 0  # finished ones forgotten


def test_abort_mid_speculation_frees_everything(spec):
    eng = spec.engine
    sp = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)
    ids = spec.get_tokenizer().encode(PROMPTS[0])
    for i in range(3):
        eng.add_request(f"abort-{i}", ids, sp)
    for _ in range(6):
        eng.step()
    assert any(s.drafts for s in eng.scheduler.running)
    for i in range(3):
        eng.abort(f"abort-{i}")
    assert not eng.has_unfinished() and pools_full(spec)


def test_sampling_with_seed_is_reproducible(spec):
    sp = SamplingParams(temperature=0.8, top_p=0.95, max_tokens=30, seed=11, ignore_eos=True)
    a = spec.generate(PROMPTS[:2], sp)
    b = spec.generate(PROMPTS[:2], sp)
    assert [o.outputs[0].token_ids for o in a] == [o.outputs[0].token_ids for o in b]
    assert all(len(o.outputs[0].token_ids) == 30 for o in a)


def test_preemption_during_speculation(spec):
    """Few blocks: sequences are preempted with drafts pending and recomputed; greedy tokens stay."""
    from tpserve.model.cache import bytes_per_block, bytes_per_slot
    from tpserve.model.mtp import mtp_config

    cfg = mtp_config(spec.engine.model_config)
    state = 4 * bytes_per_slot(cfg, 1, torch.float32)  # four prefix-cache state checkpoints
    budget = 4 * bytes_per_slot(cfg, 1, torch.float32) + 10 * bytes_per_block(cfg, 16, torch.float32) + state
    small = LLM(Model.path, device="cpu", kv_cache_memory=budget, block_size=16, speculative_config=SPEC,
                max_num_seqs=4, prefix_state_memory=state)
    assert small.engine.block_pool.num_blocks == 10
    ref = LLM(Model.path, device="cpu", kv_cache_memory="16MiB", block_size=16, max_num_seqs=8)
    sp = SamplingParams(temperature=0, max_tokens=60, ignore_eos=True)
    a = small.generate(PROMPTS, sp)
    assert small.engine.scheduler.num_preemptions > 0
    assert [o.outputs[0].token_ids for o in a] == [o.outputs[0].token_ids for o in ref.generate(PROMPTS, sp)]
    assert pools_full(small)


def test_metrics_offline(spec):
    names = {m.name: m for m in spec.get_metrics()}
    assert names["tpserve:spec_decode_num_drafts"].kind == "counter"
    assert names["tpserve:spec_decode_num_accepted_tokens_per_pos"].kind == "vector"
    assert len(names["tpserve:spec_decode_num_accepted_tokens_per_pos"].values) == 3


def test_checkpoint_without_mtp_is_a_clear_error(tiny):
    with pytest.raises(ValueError, match="MTP"):
        LLM(str(tiny("default")), device="cpu", skip_tokenizer_init=True, speculative_config=SPEC)


def test_mtp_layer_with_mhc_tensors_is_a_clear_error(tiny, tmp_path):
    """An MTP layer with hc_* tensors (the pre-release layout) refuses speculation in one line that says how to
    get a current checkpoint; without speculation it loads (the MTP layer is not read)."""
    import shutil

    from safetensors.torch import load_file, save_file

    from tpserve.model.loader import CheckpointError

    path = tmp_path / "old"
    shutil.copytree(tiny("mtp_random"), path)
    t = load_file(str(path / "model.safetensors"))
    for name in ("attn", "ffn"):  # as layer 0 holds them
        for part in ("fn", "base", "scale"):
            hc = f"hc_{name}_{part}"
            t[f"model.language_model.layers.4.{hc}"] = t[f"model.language_model.layers.0.{hc}"].clone()
    save_file(t, str(path / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"layers\.4\.hc_.*pre-release mHC layout.*tpserve train-demo") as err:
        LLM(str(path), device="cpu", skip_tokenizer_init=True, speculative_config=SPEC)
    assert "\n" not in str(err.value)
    LLM(str(path), device="cpu", kv_cache_memory="16MiB", skip_tokenizer_init=True).shutdown()


@pytest.mark.parametrize("raw, field", [('{"method": "eagle"}', "method"), ('{"num_speculative_tokens": 0}',
                                        "num_speculative_tokens"), ('{"truncate_threshold": 2}', "truncate_threshold"),
                                       ('{"k": 2}', "unknown key"), ("[1]", "JSON object"), ("{", "not valid JSON")])
def test_bad_speculative_config(raw, field):
    with pytest.raises(ValueError, match=field):
        EngineConfig(speculative_config=raw)


def test_scheduled_counts_drafts():
    from tpserve.engine.request import Sequence

    seq = Sequence("r", 0, [1, 2, 3], SamplingParams(), 10, frozenset())
    seq.num_computed, seq.drafts = 2, [7, 8]
    s = Scheduled(seq, 3, decode=True)
    assert s.num_drafts == 2 and s.completes and [seq.token_at(p) for p in range(5)] == [1, 2, 3, 7, 8]
    assert dataclasses.replace(s, num_tokens=1).num_drafts == 0


def test_server_metrics_export_spec_counters(spec):
    from tpserve.server.metrics import ServerMetrics

    spec.generate(PROMPTS[:1], SamplingParams(temperature=0, max_tokens=12))
    text = ServerMetrics(spec.engine.stats).render().decode()
    stats = spec.engine.stats()
    assert f"tpserve:spec_decode_num_drafts_total {float(stats['spec_decode_num_drafts'])}" in text
    assert f"tpserve:spec_decode_num_accepted_tokens_total {float(stats['spec_decode_num_accepted_tokens'])}" in text
    assert 'tpserve:spec_decode_num_accepted_tokens_per_pos_total{position="0"}' in text


def test_mtp_draft_matches_plain_torch_recipe(spec):
    """The engine's MTP forward (cache, paged latent, decode/prefill kernels) against train/model.py's
    plain-torch MTP step (x = eh_proj(cat[enorm(embed(t+1)), hnorm(h)]) -> block -> shared_head.norm ->
    lm_head) on the same checkpoint: depth-1 logits at every prompt position."""
    from tpserve.engine.runner import StepPlan
    from tpserve.train.model import TrainModel, load_checkpoint_

    eng = spec.engine
    runner = eng.executor.runner
    ids = spec.get_tokenizer().encode(PROMPTS[3] + " 19\nQ: What is 3 + 4?\nA:")
    n = len(ids)
    blocks, slot = eng.block_pool.allocate(-(-n // 16)), eng.slot_pool.allocate(1)[0]
    try:
        runner.execute(StepPlan(ids, list(range(n)), [0, n], [0], [slot], [blocks], [n - 1], [slot]))
        drafted = runner.draft(StepPlan(ids[1:], list(range(n - 1)), [0, n - 1], [0], [slot], [blocks],
                                        list(range(n - 1)), []), list(range(n - 1)), True)
        got = drafted.logits
    finally:
        eng.block_pool.free(blocks)
        eng.slot_pool.free([slot])
    ref_model = TrainModel(eng.model_config)
    load_checkpoint_(ref_model, eng.model_dir)
    with torch.no_grad():
        out = ref_model(torch.tensor([ids]))
        _, ref = ref_model.mtp_step(out.hidden[:, :n - 1], torch.tensor([ids[1:]]))
    ref = ref[0].float()
    assert torch.equal(got.argmax(-1), ref.argmax(-1))
    # the greedy draws that go to the host: the argmax and its softmax probability
    assert torch.equal(drafted.greedy[0].long(), got.argmax(-1))
    assert torch.allclose(drafted.greedy[1], got.softmax(-1).max(-1).values.double(), rtol=1e-5, atol=1e-7)
    bound = 1e-4 * ref.abs().max().item()  # fp32, two code paths (paged cache, fused forms vs plain torch)
    assert (got - ref).abs().max().item() < bound, ((got - ref).abs().max().item(), bound)


def test_greedy_with_penalties_walks_position_by_position(plain, spec):
    """A repetition penalty makes each verified row's choice depend on the tokens accepted before it
    (the per-position walk, not the one-shot argmax): tokens still equal plain decoding's."""
    sp = SamplingParams(temperature=0, max_tokens=30, repetition_penalty=1.3, ignore_eos=True)
    a, b = plain.generate(PROMPTS, sp), spec.generate(PROMPTS, sp)
    assert [o.outputs[0].token_ids for o in b] == [o.outputs[0].token_ids for o in a]
    assert pools_full(spec)
