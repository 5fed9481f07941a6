"""`tpserve make-tiny`: a small random glm5_next checkpoint (weights, config, tokenizer, template).

The tensors are written under the names transformers 5.23.0 writes, so the same directory loads
in transformers (the oracle) and in tpserve; with `mtp` the MTP layer follows as layer
num_hidden_layers in the published layout (model/mtp.py; transformers skips it). Values are
random but not degenerate: the router, the gates, the indexer's pooling weights and the mHC
projections all get random values, so routing and sparse selection are exercised (transformers'
own init leaves several at zero).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from tpserve.model.config import ModelConfig
from tpserve.model.layers import ShardContext
from tpserve.model.loader import checkpoint_name

TINY_TEXT: dict[str, Any] = dict(
    vocab_size=512, hidden_size=64, intermediate_size=96, moe_intermediate_size=48, num_hidden_layers=4,
    num_attention_heads=6, num_key_value_heads=6, n_shared_experts=1, n_routed_experts=8, num_experts_per_tok=2,
    n_group=1, topk_group=1, kv_lora_rank=32, q_lora_rank=48, qk_rope_head_dim=0, qk_nope_head_dim=16,
    v_head_dim=16, index_topk=16, index_head_dim=16, index_n_heads=8, index_kpool=4, linear_head_dim=16,
    linear_num_heads=6, linear_conv_kernel_dim=4, hc_mult=4, max_position_embeddings=4096,
    rms_norm_eps=1e-5, routed_scaling_factor=2.5, swiglu_limit=10.0, tie_word_embeddings=False,
)
TINY_VISION: dict[str, Any] = dict(depth=1, hidden_size=32, num_heads=2, intermediate_size=32, out_hidden_size=64,
                                   projection_intermediate_size=32)


def _random_tensor(name: str, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    """Random values for a tensor by its (checkpoint or model) name, on the generator's device."""
    dev = gen.device
    randn = lambda: torch.randn(shape, generator=gen, device=dev)  # noqa: E731
    if name.endswith("A_log"):
        return torch.empty(shape, device=dev).uniform_(1.0, 16.0, generator=gen).log()
    if name.endswith("dt_bias"):
        dt = torch.empty(shape, device=dev).uniform_(math.log(1e-3), math.log(1e-1), generator=gen).exp()
        return dt + torch.log(-torch.expm1(-dt))
    if name.endswith("k_norm.bias"):
        return 0.1 * randn()
    if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
        return 1.0 + 0.1 * randn()
    if name.endswith("hc.base"):
        return 0.5 * randn()
    if name.endswith("hc.scale"):
        return 1.0 + 0.2 * randn()
    if name.endswith("e_score_correction_bias"):
        return 0.05 * randn()
    if name.endswith("index_kpool_compress_ape"):
        return randn()
    if "conv" in name:
        return 0.5 * randn()
    if name.startswith("embed_tokens"):
        return randn()
    return randn() / math.sqrt(shape[-1])  # linear weights [out, in]: unit-variance outputs


@torch.no_grad()
def randomize_(model: torch.nn.Module, seed: int = 0) -> None:
    """Fill a model's parameters with random values in place (`--load-format dummy`), in slices
    along the first dim so the fp32 temporaries stay small."""
    gen = None
    for name, param in model.named_parameters():
        if gen is None or gen.device != param.device:
            gen = torch.Generator(param.device).manual_seed(seed)
        step = max(1, (1 << 26) // max(1, param[0].numel())) if param.dim() > 1 else param.shape[0]
        for start in range(0, param.shape[0], step):
            piece = param[start:start + step]
            piece.copy_(_random_tensor(name, tuple(piece.shape), gen))


def tiny_config_dict(layers: int = 4, **overrides: Any) -> dict[str, Any]:
    text = dict(TINY_TEXT, num_hidden_layers=layers)
    text.update(overrides)
    return {"architectures": ["Glm5NextForConditionalGeneration"], "model_type": "glm5_next",
            "text_config": text, "vision_config": dict(TINY_VISION),
            "tie_word_embeddings": bool(text.get("tie_word_embeddings", False))}


def checkpoint_shapes(cfg: ModelConfig, mtp: bool = False) -> list[tuple[str, tuple[int, ...]]]:
    """(model name, full shape) of every tensor the checkpoint holds, in name order; with `mtp` the MTP
    layer's after them (`mtp.*`), so the main model's values do not depend on it."""
    from tpserve.model.glm5_next import Glm5NextModel
    from tpserve.model.weights import checkpoint_sources

    ctx = ShardContext.single(torch.float32, "meta")
    with torch.device("meta"):
        parts = [("", Glm5NextModel(ctx, cfg))]
        if mtp:
            from tpserve.model.mtp import MtpLayer

            parts.append(("mtp.", MtpLayer(ctx, cfg)))
    return [(prefix + name, tuple(src.full_shape)) for prefix, module in parts
            for name, (_, src) in sorted(checkpoint_sources(module).items())]


def random_tensors(cfg: ModelConfig, seed: int, dtype: torch.dtype = torch.float32, device: str = "cpu",
                   mtp: bool = False):
    """(checkpoint name, random tensor) for every tensor the model expects (transformers' names), one at a
    time (a real-width checkpoint does not fit in memory at once), made on `device`."""
    gen = torch.Generator(device).manual_seed(seed)
    for name, shape in checkpoint_shapes(cfg, mtp):
        yield checkpoint_name(name, cfg.num_hidden_layers), _random_tensor(name, shape, gen).to(dtype).contiguous()


def random_state_dict(cfg: ModelConfig, seed: int, dtype: torch.dtype = torch.float32,
                      mtp: bool = False) -> dict[str, torch.Tensor]:
    """Random tensors for every checkpoint name the model expects (transformers' names)."""
    return dict(random_tensors(cfg, seed, dtype, mtp=mtp))


def make_tiny(out_dir: str | Path, *, seed: int = 0, layers: int = 4, dtype: torch.dtype = torch.float32,
              mtp: bool = False, **overrides: Any) -> Path:
    """Write a tiny random glm5_next checkpoint (with tokenizer and chat template) into out_dir; with `mtp`
    an MTP layer too (speculative decoding)."""
    from tpserve.model.tiny_tokenizer import write_tiny_tokenizer

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    raw = tiny_config_dict(layers, **overrides)
    if mtp:
        raw["text_config"]["num_nextn_predict_layers"] = 1
    tok = write_tiny_tokenizer(out, raw["text_config"]["vocab_size"])
    eos = list(tok["eos_token_id"])
    raw["text_config"].setdefault("eos_token_id", eos)
    raw["text_config"].setdefault("pad_token_id", tok["pad_token_id"])
    cfg = ModelConfig.from_dict(raw)
    (out / "config.json").write_text(json.dumps(raw, indent=2) + "\n")
    gen_cfg = {"eos_token_id": eos, "pad_token_id": tok["pad_token_id"], "do_sample": False}
    (out / "generation_config.json").write_text(json.dumps(gen_cfg, indent=2) + "\n")
    save_file(random_state_dict(cfg, seed, dtype, mtp), str(out / "model.safetensors"), metadata={"format": "pt"})
    return out
