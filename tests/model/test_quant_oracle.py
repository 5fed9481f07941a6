"""Quantized checkpoints (written by `tpserve quantize`) against transformers run on the same
weights dequantized: greedy tokens exact, prefill logits within fp32 rounding (the reference path
dequantizes then multiplies in fp32, so both sides compute with identical weight values)."""

import pytest
import torch

from helpers import assert_logits_match_oracle, prefill_logits, random_prompts, reference_greedy
from tpserve import LLM, SamplingParams
from tpserve.tools.quantize import dequantize_checkpoint, quantize_checkpoint

LENGTHS = (7, 45)
NEW_TOKENS = 10


@pytest.fixture(scope="module")
def pairs(tiny, tmp_path_factory):
    root = tmp_path_factory.mktemp("quant")
    out = {}
    for method, block in (("fp8", 8), ("nvfp4", 0)):  # block 8: TP=2 splits 48-wide experts into whole blocks
        name = f"{method}-{block}"
        q = quantize_checkpoint(tiny("default"), root / name, method, block=block or 128)
        out[name] = (q, dequantize_checkpoint(q, root / f"{name}-deq"))
    return out


@pytest.mark.parametrize("name", ["fp8-8", "nvfp4-0"])
def test_quantized_greedy_matches_transformers_on_dequantized(pairs, name):
    qpath, dpath = pairs[name]
    prompts = random_prompts(LENGTHS, seed=7)
    llm = LLM(str(qpath), device="cpu", kv_cache_memory="8MiB", block_size=16, max_num_batched_tokens=40)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True))
    for prompt, out in zip(prompts, outs):
        assert out.outputs[0].token_ids == reference_greedy(dpath, prompt, NEW_TOKENS), f"prompt of {len(prompt)}"
    assert_logits_match_oracle(prefill_logits(llm, prompts[1]), dpath, prompts[1])


def test_quantized_weights_stay_quantized(pairs):
    llm = LLM(str(pairs["nvfp4-0"][0]), device="cpu", kv_cache_memory="8MiB", block_size=16)
    model = llm.engine.executor.runner.model
    dtypes = {n: p.dtype for n, p in model.named_parameters()}
    assert dtypes["layers.3.mlp.experts.gate_up_proj"] == torch.uint8
    assert dtypes["layers.3.mlp.experts.gate_up_bscale"] == torch.float8_e4m3fn
    # nvfp4: experts only; q, k, v stay 16-bit (here fp32), stacked into one weight (model/merged.py)
    assert dtypes["layers.0.self_attn.qkv_weight"] == torch.float32
    assert "layers.0.self_attn.q_proj.weight" not in dtypes
    llm = LLM(str(pairs["fp8-8"][0]), device="cpu", kv_cache_memory="8MiB", block_size=16)
    model = llm.engine.executor.runner.model
    dtypes = {n: p.dtype for n, p in model.named_parameters()}
    assert dtypes["layers.0.self_attn.q_proj.weight"] == torch.float8_e4m3fn
    assert dtypes["layers.3.mlp.experts.down_proj"] == torch.float8_e4m3fn
    assert dtypes["layers.3.mlp.shared_experts.down_proj.weight"] == torch.float8_e4m3fn


def test_quantized_tp2_matches_transformers_on_dequantized(pairs):
    """Two CPU ranks (gloo): each loads its slices of the fp8 weights and their block scales."""
    qpath, dpath = pairs["fp8-8"]
    prompt = random_prompts((30,), seed=5)[0]
    llm = LLM(str(qpath), device="cpu", kv_cache_memory="8MiB", block_size=16, tensor_parallel_size=2,
              sequence_parallel=False)
    try:
        out = llm.generate([{"prompt_token_ids": prompt}], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
        assert out[0].outputs[0].token_ids == reference_greedy(dpath, prompt, 6)
    finally:
        llm.shutdown()
