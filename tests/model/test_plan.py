"""Start-up memory plan from the real GLM-5.3-Flash config (fixtures/glm53_flash/config.json: the published
config's values, docs/checkpoints.md; the numbers of DESIGN.md), computed on the meta device: nothing is
allocated."""

import functools
from pathlib import Path

import pytest
import torch

from tpserve.collectives.comm import Communicator
from tpserve.kernels.choice import Kernels, WeightOptions
from tpserve.model.build import plan_model
from tpserve.model.config import ModelConfig
from tpserve.model.layers import ShardContext
from tpserve.model.plan import cut_layers, memory_plan

REAL = Path(__file__).parent / "fixtures" / "glm53_flash"
H200 = int(139.8 * 2**30)


@functools.lru_cache(maxsize=None)
def _plan(method, world, cfg=None):
    """(meta model, plan); cached: building the 45-layer meta model takes seconds."""
    cfg = cfg or ModelConfig.from_file(REAL)
    ctx = ShardContext(0, world, torch.bfloat16, Communicator(None, torch.device("cpu")))
    model, qc, _ = plan_model(REAL, cfg, ctx, Kernels(weights=WeightOptions(quantization=method)), "dummy")
    assert all(p.is_meta for p in model.parameters())
    return model, memory_plan(model, cfg, rank=0, world=world, dtype=torch.bfloat16, device_bytes=H200,
                              utilization=0.9, activation_bytes=4 * 2**30)


def test_fixture_is_the_real_config():
    cfg = ModelConfig.from_file(REAL)
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.vocab_size) == (45, 4096, 154880)
    assert (cfg.n_routed_experts, cfg.moe_intermediate_size, cfg.num_experts_per_tok) == (288, 2048, 8)
    assert (len(cfg.mla_layers), len(cfg.kda_layers), cfg.mlp_layer_types.count("sparse")) == (11, 34, 42)
    # the published spelling of the MLA layers (deepseek_sparse_attention), kpool, eos ids, the MTP layer
    assert cfg.mla_layers == tuple(range(3, 45, 4)) and cfg.index_kpool == 4
    assert cfg.eos_token_id == (154820, 154827, 154829) and cfg.pad_token_id == 154820
    assert cfg.num_nextn_predict_layers == 1 and (cfg.linear_num_heads, cfg.linear_head_dim) == (64, 128)
    from transformers import AutoConfig

    ref = AutoConfig.from_pretrained(REAL).text_config
    assert list(cfg.layer_types) == ref.layer_types and list(cfg.indexer_types) == ref.indexer_types
    assert (cfg.index_kpool, cfg.linear_lower_bound) == (ref.index_kpool, ref.linear_lower_bound)


def test_nvfp4_experts_at_tp2_fit_and_the_weights_are_exact():
    model, plan = _plan("nvfp4", 2)
    cfg = ModelConfig.from_file(REAL)
    experts = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if ".experts." in n)
    d, i, e = cfg.hidden_size, cfg.moe_intermediate_size // 2, cfg.n_routed_experts
    # per expert and rank: 3 projections of d x i values at 4 bits + one fp8 scale per 16 values, and
    # three fp32 global scales
    per_expert = 3 * d * i // 2 + 3 * d * i // 16 + 3 * 4
    assert experts == 42 * e * per_expert
    assert plan.requests_fit >= 32
    plan.check()


@pytest.mark.parametrize(("method", "world"), [(None, 1), (None, 2), ("fp8", 2), ("nvfp4", 1)])
def test_plans_that_cannot_fit_are_a_clear_error(method, world):
    _, plan = _plan(method, world)
    assert plan.requests_fit == 0
    with pytest.raises(ValueError, match="memory plan does not fit: rank 0/.*weights .* GiB"):
        plan.check()


def test_fp8_weights_are_about_half_of_bf16():
    _, bf16 = _plan(None, 2)
    _, fp8 = _plan("fp8", 2)
    # fp8 block 128: 1 byte per value + 4 bytes per 128x128 block; embeddings, lm_head, norms, router
    # and the small linears stay bf16
    assert 0.49 < fp8.weight_bytes / bf16.weight_bytes < 0.52


def test_cut_layers_for_one_gpu_benches():
    cfg = cut_layers(ModelConfig.from_file(REAL), 8)
    assert cfg.num_hidden_layers == 8 and len(cfg.layer_types) == 8
    _, plan = _plan("nvfp4", 1, cfg)
    assert plan.requests_fit >= 1
    with pytest.raises(ValueError, match="num_layers must be in"):
        cut_layers(cfg, 0)


def test_plan_counts_the_mhc_projection_split():
    """With --mhc-project-backend triton (bf16) every mHC block holds its projection weight split into three bf16
    parts after loading (model/mhc.py prepare_runtime): the plan counts them with the weights (90 blocks of the real
    model: 3 x 24 x 16,384 x 2 bytes each, 212 MB)."""
    cfg = ModelConfig.from_file(REAL)
    ctx = ShardContext(0, 2, torch.bfloat16, Communicator(None, torch.device("cpu")))
    sizes = {}
    for project in ("torch", "triton"):
        model, _, _ = plan_model(REAL, cfg, ctx, Kernels(mhc_project=project,
                                                          weights=WeightOptions(quantization="nvfp4")), "dummy")
        sizes[project] = memory_plan(model, cfg, rank=0, world=2, dtype=torch.bfloat16, device_bytes=H200,
                                     utilization=0.9, activation_bytes=4 * 2**30).weight_bytes
    blocks = 2 * cfg.num_hidden_layers
    assert sizes["triton"] - sizes["torch"] == blocks * 3 * (2 + cfg.hc_mult) * cfg.hc_mult * cfg.hc_mult * 4096 * 2
