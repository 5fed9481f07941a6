"""Model sizes for `tpserve train-demo`: `demo` (the shipped model) and `tiny` (CPU tests)."""

from __future__ import annotations

from typing import Any

DEMO: dict[str, Any] = dict(
    hidden_size=256, intermediate_size=512, moe_intermediate_size=128, num_hidden_layers=6,
    num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1, n_routed_experts=8, num_experts_per_tok=2,
    n_group=1, topk_group=1, kv_lora_rank=128, q_lora_rank=128, qk_rope_head_dim=0, qk_nope_head_dim=64,
    v_head_dim=64, index_topk=256, index_head_dim=32, index_n_heads=4, index_kpool=8, linear_head_dim=64,
    linear_num_heads=4, linear_conv_kernel_dim=4, hc_mult=4, max_position_embeddings=8192, rms_norm_eps=1e-5,
    routed_scaling_factor=2.5, swiglu_limit=10.0, tie_word_embeddings=False,
    layer_types=["linear_attention", "linear_attention", "indexed_attention"] * 2,
    mlp_layer_types=["dense"] + ["sparse"] * 5, indexer_types=["full"] * 6,
)

TINY: dict[str, Any] = dict(
    DEMO, hidden_size=32, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=4,
    num_attention_heads=2, num_key_value_heads=2, n_routed_experts=4, kv_lora_rank=16, q_lora_rank=16,
    qk_nope_head_dim=8, v_head_dim=8, index_topk=16, index_head_dim=8, index_n_heads=2, index_kpool=4,
    linear_head_dim=8, linear_num_heads=2, hc_sinkhorn_iters=4,
    layer_types=["linear_attention", "indexed_attention", "linear_attention", "indexed_attention"],
    mlp_layer_types=["dense", "sparse", "sparse", "sparse"], indexer_types=["full", "full", "full", "full"],
)

PRESETS = {"demo": DEMO, "tiny": TINY}


def config_dict(preset: str, vocab_size: int, eos: list[int], pad: int) -> dict[str, Any]:
    if preset not in PRESETS:
        raise ValueError(f"preset: unknown {preset!r}, expected one of {sorted(PRESETS)}")
    text = dict(PRESETS[preset], vocab_size=vocab_size, eos_token_id=eos, pad_token_id=pad,
                num_nextn_predict_layers=1)
    from tpserve.model.tiny import TINY_VISION  # transformers builds a vision tower; keep it tiny

    return {"architectures": ["Glm5NextForConditionalGeneration"], "model_type": "glm5_next", "text_config": text,
            "vision_config": dict(TINY_VISION), "tie_word_embeddings": False}
