"""ModelConfig: the glm5_next text config, read from a checkpoint's config.json.

Follows transformers 5.23.0 `Glm5NextTextConfig` (defaults, derived schedules, aliases). The
text fields may sit under `text_config` or at the top level (flat text-only checkpoints).
Every field is honoured; a value tpserve does not support raises `UnsupportedConfigError`
naming the field.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from tpserve.model.errors import UnsupportedConfigError

_LAYER_TYPES = ("linear_attention", "indexed_attention")
# older names mapped as transformers 5.23.0 maps them (glm5_next's full_attention, then those of
# configuration_utils._LEGACY_LAYER_TYPE_REMAP that land on a glm5_next layer type); the published config
# spells its MLA layers deepseek_sparse_attention
_LAYER_TYPE_ALIASES = {"full_attention": "indexed_attention", "deepseek_sparse_attention": "indexed_attention",
                       "qwen_sparse_attention": "indexed_attention", "mamba": "linear_attention"}
_MLP_TYPES = ("dense", "sparse")
_INDEXER_TYPES = ("full", "shared")
_MODEL_TYPES = ("glm5_next", "glm5_next_text")


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 154880
    hidden_size: int = 4096
    intermediate_size: int = 12288
    moe_intermediate_size: int = 2048
    num_hidden_layers: int = 45
    num_attention_heads: int = 64
    num_key_value_heads: int = 64
    n_shared_experts: int = 1
    n_routed_experts: int = 288
    routed_scaling_factor: float = 2.5
    kv_lora_rank: int = 512
    q_lora_rank: int = 1536
    qk_rope_head_dim: int = 0
    v_head_dim: int = 256
    qk_nope_head_dim: int = 256
    n_group: int = 1
    topk_group: int = 1
    num_experts_per_tok: int = 8
    norm_topk_prob: bool = True
    hidden_act: str = "silu"
    max_position_embeddings: int = 1048576
    rms_norm_eps: float = 1e-5
    pad_token_id: int | None = 154820
    bos_token_id: int | None = None
    eos_token_id: tuple[int, ...] = ()
    tie_word_embeddings: bool = False
    mlp_layer_types: tuple[str, ...] = ()
    attention_bias: bool = False
    index_topk: int = 2048
    index_head_dim: int = 128
    index_n_heads: int = 32
    layer_types: tuple[str, ...] = ()
    indexer_types: tuple[str, ...] = ()
    swiglu_limit: float = 10.0
    linear_head_dim: int = 128
    linear_num_heads: int = 64
    linear_conv_kernel_dim: int = 4
    linear_lower_bound: float | None = -5.0
    hc_mult: int = 4
    hc_eps: float = 1e-6
    hc_sinkhorn_iters: int = 20
    index_kpool: int = 16
    index_kpool_always_select_tail: bool = True
    # MTP layers after the main ones (the published checkpoints have one: speculative decoding's drafter)
    num_nextn_predict_layers: int = 0
    # the MTP layer's chained depths reuse the catch-up's selection instead of running its indexer (vLLM)
    index_share_for_mtp_iteration: bool = False

    # ---------------------------------------------------------------- derived
    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def linear_qkv_dim(self) -> int:
        return self.linear_head_dim * self.linear_num_heads

    @property
    def mla_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == "indexed_attention")

    @property
    def kda_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == "linear_attention")

    def indexer_is_full(self, layer: int) -> bool:
        return self.indexer_types[layer] == "full"

    def shares_topk_forward(self, layer: int) -> bool:
        """A full MLA layer whose next layer reuses its selection (transformers' next_skip_topk)."""
        nxt = min(layer + 1, self.num_hidden_layers - 1)
        return self.indexer_is_full(layer) and self.indexer_types[nxt] == "shared"

    # ------------------------------------------------------------------ load
    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> "ModelConfig":
        model_type = raw.get("model_type")
        if model_type is not None and model_type not in _MODEL_TYPES:
            raise UnsupportedConfigError(
                f"model_type: tpserve serves glm5_next checkpoints, got {model_type!r}")
        text = raw.get("text_config")
        if text is None:
            text = dict(raw)
        elif not isinstance(text, dict):
            raise UnsupportedConfigError("text_config: expected an object")
        else:
            text = dict(text)
            if "tie_word_embeddings" in raw:  # the top-level flag ties the LM head (transformers)
                text["tie_word_embeddings"] = raw["tie_word_embeddings"]
        if raw.get("quantization_config") or text.get("quantization_config"):  # supported methods: model/quant_config.py
            from tpserve.model.quant_config import parse_quant_config

            parse_quant_config(raw.get("quantization_config") or text.get("quantization_config"))
        return cls._from_text_dict(text)

    @classmethod
    def from_file(cls, path: str | Path) -> "ModelConfig":
        path = Path(path)
        if path.is_dir():
            path = path / "config.json"
        if not path.is_file():
            raise FileNotFoundError(f"no config.json at {path}")
        try:
            raw = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise UnsupportedConfigError(f"config.json: not valid JSON ({exc})") from None
        return cls.from_dict(raw)

    @classmethod
    def _from_text_dict(cls, t: dict[str, Any]) -> "ModelConfig":
        known = {f.name for f in fields(cls)}
        values: dict[str, Any] = {k: v for k, v in t.items() if k in known}
        if "num_local_experts" in t and "n_routed_experts" not in t:
            values["n_routed_experts"] = t["num_local_experts"]
        if "num_nextn_predict_layers" in values and values["num_nextn_predict_layers"] is None:
            values["num_nextn_predict_layers"] = 0
        if values.get("num_key_value_heads") is None:
            values["num_key_value_heads"] = values.get("num_attention_heads", cls.num_attention_heads)
        lin = t.get("linear_attn_config")
        if isinstance(lin, dict):
            values["linear_head_dim"] = lin.get("head_dim", values.get("linear_head_dim", cls.linear_head_dim))
            values["linear_num_heads"] = lin.get("num_heads", values.get("linear_num_heads", cls.linear_num_heads))
            values["linear_conv_kernel_dim"] = lin.get(
                "short_conv_kernel_size", values.get("linear_conv_kernel_dim", cls.linear_conv_kernel_dim))
            lb = lin.get("gate_lower_bound", values.get("linear_lower_bound", cls.linear_lower_bound))
            if lin.get("safe_gate", True) and lb is None:
                lb = -5.0
            values["linear_lower_bound"] = lb
        n_layers = int(values.get("num_hidden_layers", cls.num_hidden_layers))
        values["num_hidden_layers"] = n_layers
        if t.get("mlp_layer_types") is None:
            values["mlp_layer_types"] = ["dense"] * min(3, n_layers) + ["sparse"] * max(n_layers - 3, 0)
        if t.get("layer_types") is None:
            values["layer_types"] = ["linear_attention" if i % 4 != 3 else "indexed_attention"
                                     for i in range(n_layers)]
        if isinstance(values["layer_types"], (list, tuple)):
            values["layer_types"] = [_LAYER_TYPE_ALIASES.get(x, x) if isinstance(x, str) else x
                                     for x in values["layer_types"]]
        if t.get("indexer_types") is None:
            pattern = t.get("index_topk_pattern")
            if pattern is not None:
                if isinstance(pattern, str):
                    bad = set(pattern) - {"F", "S"}
                    if bad:
                        raise UnsupportedConfigError(
                            f"index_topk_pattern: letters must be F or S, got {sorted(bad)}")
                    values["indexer_types"] = [{"F": "full", "S": "shared"}[c] for c in pattern]
                else:
                    values["indexer_types"] = list(pattern)
            else:
                freq = max(int(t.get("index_topk_freq", 1)), 1)
                offset = int(t.get("index_skip_topk_offset", 2))
                values["indexer_types"] = ["full" if (max(i - offset + 1, 0) % freq) == 0 else "shared"
                                           for i in range(n_layers)]
        eos = values.get("eos_token_id")
        values["eos_token_id"] = () if eos is None else tuple(eos) if isinstance(eos, list) else (eos,)
        for key in ("mlp_layer_types", "layer_types", "indexer_types"):
            if not isinstance(values[key], (list, tuple)):
                raise UnsupportedConfigError(f"{key}: expected a list, got {values[key]!r}")
            values[key] = tuple(values[key])
        cfg = cls(**values)
        cfg.validate()
        return cfg

    def with_overrides(self, overrides: dict[str, Any]) -> "ModelConfig":
        """This config with fields replaced (EngineConfig.hf_overrides). num_hidden_layers keeps the
        first N layers (1 <= N <= the checkpoint's): the per-layer type lists are cut to match and
        the loader skips the later layers' weights. An unknown field is an error naming it."""
        if not overrides:
            return self
        known = {f.name for f in fields(self)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise UnsupportedConfigError(f"hf_overrides: unknown model config field(s) {unknown}")
        values = dict(overrides)
        n = values.get("num_hidden_layers")
        if n is not None:
            if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= self.num_hidden_layers:
                raise UnsupportedConfigError(f"hf_overrides.num_hidden_layers: an integer in [1, "
                                             f"{self.num_hidden_layers}] (the checkpoint's layers), got {n!r}")
            for name in ("layer_types", "mlp_layer_types", "indexer_types"):
                values.setdefault(name, getattr(self, name)[:n])
        for name in ("layer_types", "mlp_layer_types", "indexer_types"):
            if name in values:
                values[name] = tuple(values[name])
        out = dataclasses.replace(self, **values)
        out.validate()
        return out

    # -------------------------------------------------------------- validate
    def validate(self) -> None:
        def bad(field: str, why: str) -> None:
            raise UnsupportedConfigError(f"{field}: {why} (got {getattr(self, field)!r})")

        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                     "kv_lora_rank", "q_lora_rank", "v_head_dim", "qk_nope_head_dim", "index_head_dim",
                     "index_n_heads", "linear_head_dim", "linear_num_heads", "linear_conv_kernel_dim",
                     "hc_mult", "hc_sinkhorn_iters", "index_kpool", "index_topk", "num_experts_per_tok",
                     "n_group", "topk_group", "intermediate_size", "moe_intermediate_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                bad(name, "must be a positive integer")
        if not isinstance(self.num_nextn_predict_layers, int) or isinstance(self.num_nextn_predict_layers, bool) \
                or self.num_nextn_predict_layers < 0:
            bad("num_nextn_predict_layers", "must be an integer >= 0")
        if not isinstance(self.index_share_for_mtp_iteration, bool):
            bad("index_share_for_mtp_iteration", "must be true or false")
        if self.n_shared_experts < 0:
            bad("n_shared_experts", "must be >= 0")
        if self.n_routed_experts < 1:
            bad("n_routed_experts", "must be a positive integer")
        if self.hidden_act != "silu":
            bad("hidden_act", "only silu is supported")
        if self.qk_rope_head_dim != 0:
            bad("qk_rope_head_dim", "glm5_next MLA is NoPE; only 0 is supported")
        if self.num_key_value_heads != self.num_attention_heads:
            bad("num_key_value_heads", "must equal num_attention_heads")
        if self.index_topk % self.index_kpool:
            bad("index_topk", f"must be divisible by index_kpool ({self.index_kpool})")
        if self.n_routed_experts % self.n_group:
            bad("n_group", f"must divide n_routed_experts ({self.n_routed_experts})")
        if self.topk_group > self.n_group:
            bad("topk_group", f"must be <= n_group ({self.n_group})")
        per_group = self.n_routed_experts // self.n_group
        if per_group < 2:
            bad("n_group", "each expert group needs at least 2 experts (group score = top-2 sum)")
        if self.num_experts_per_tok > self.topk_group * per_group:
            bad("num_experts_per_tok", "exceeds the experts available in topk_group groups")
        if self.hc_mult < 1:
            bad("hc_mult", "must be >= 1")
        for key, allowed in (("layer_types", _LAYER_TYPES), ("mlp_layer_types", _MLP_TYPES),
                             ("indexer_types", _INDEXER_TYPES)):
            seq = getattr(self, key)
            if len(seq) != self.num_hidden_layers:
                bad(key, f"needs one entry per layer ({self.num_hidden_layers})")
            unknown = sorted(set(seq) - set(allowed))
            if unknown:
                raise UnsupportedConfigError(f"{key}: unsupported value(s) {unknown}; expected {allowed}")
        prev_full_mla = False
        for i, kind in enumerate(self.layer_types):
            if kind == "indexed_attention" and self.indexer_types[i] == "shared" and not prev_full_mla:
                raise UnsupportedConfigError(
                    f"indexer_types: layer {i} is a shared indexer layer but layer {i - 1} is not a full "
                    "indexed_attention layer to take the top-k selection from")
            prev_full_mla = kind == "indexed_attention" and self.indexer_types[i] == "full"
        if self.linear_lower_bound is not None and not isinstance(self.linear_lower_bound, (int, float)):
            bad("linear_lower_bound", "must be a number or null")
        for eos in self.eos_token_id:
            if not isinstance(eos, int) or not 0 <= eos < self.vocab_size:
                raise UnsupportedConfigError(f"eos_token_id: {eos!r} is not a token id < vocab_size")
