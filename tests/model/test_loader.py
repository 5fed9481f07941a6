"""Bad checkpoints and configs fail at load with errors that name the problem."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from helpers import prefill_logits, random_prompts
from tpserve import LLM
from tpserve.model.config import ModelConfig, UnsupportedConfigError
from tpserve.model.loader import CheckpointError

KEY = "model.language_model.layers.3.self_attn.kv_b_proj.weight"


def _copy(tiny, tmp_path):
    dst = tmp_path / "ckpt"
    shutil.copytree(tiny("default"), dst)
    return dst


def _edit_weights(path, fn):
    tensors = load_file(str(path / "model.safetensors"))
    fn(tensors)
    save_file(tensors, str(path / "model.safetensors"))


def _load(path, **kw):
    return LLM(str(path), device="cpu", kv_cache_memory="4MiB", skip_tokenizer_init=True, **kw)


def test_missing_tensor_is_named(tiny, tmp_path):
    path = _copy(tiny, tmp_path)
    _edit_weights(path, lambda t: t.pop(KEY))
    with pytest.raises(CheckpointError, match=r"missing.*layers\.3\.self_attn\.kv_b_proj\.weight"):
        _load(path)


def test_wrong_shape_is_named(tiny, tmp_path):
    path = _copy(tiny, tmp_path)
    _edit_weights(path, lambda t: t.__setitem__(KEY, t[KEY][:-1]))
    with pytest.raises(CheckpointError, match=r"kv_b_proj\.weight: shape \[191, 32\].*expected \[192, 32\]"):
        _load(path)


def test_unexpected_tensor_is_named(tiny, tmp_path):
    path = _copy(tiny, tmp_path)
    _edit_weights(path, lambda t: t.__setitem__("model.language_model.layers.0.self_attn.bogus", torch.zeros(2)))
    with pytest.raises(CheckpointError, match=r"unexpected.*layers\.0\.self_attn\.bogus"):
        _load(path)


def test_vision_and_mtp_tensors_are_skipped(tiny, tmp_path):
    path = _copy(tiny, tmp_path)

    def add(t):
        t["model.visual.blocks.0.norm1.weight"] = torch.ones(4)
        t["model.language_model.layers.8.eh_proj.weight"] = torch.ones(2, 2)  # layer past num_hidden_layers

    _edit_weights(path, add)
    _load(path)


@pytest.mark.parametrize("field,value,match", [
    ("hidden_act", "gelu", "hidden_act"),
    ("qk_rope_head_dim", 64, "qk_rope_head_dim"),
    ("layer_types", ["linear_attention"] * 7 + ["sliding_attention"], "layer_types"),
    ("indexer_types", ["shared"] * 8, "indexer_types"),
    ("index_topk", 18, "index_topk"),
    ("num_key_value_heads", 2, "num_key_value_heads"),
    ("mlp_layer_types", ["dense"] * 3, "mlp_layer_types"),
])
def test_unsupported_config_value_is_named(tiny, tmp_path, field, value, match):
    path = _copy(tiny, tmp_path)
    raw = json.loads((path / "config.json").read_text())
    raw["text_config"][field] = value
    (path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(UnsupportedConfigError, match=match):
        _load(path)


def test_quantized_checkpoint_is_refused(tiny, tmp_path):
    path = _copy(tiny, tmp_path)
    raw = json.loads((path / "config.json").read_text())
    raw["quantization_config"] = {"quant_method": "fp8"}
    (path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(UnsupportedConfigError, match="quantization_config.*fp8"):
        _load(path)


def test_flat_text_config_equals_nested(tiny):
    raw = json.loads((tiny("default") / "config.json").read_text())
    flat = dict(raw["text_config"], model_type="glm5_next")
    assert ModelConfig.from_dict(flat) == ModelConfig.from_dict(raw)


def test_derived_schedules_follow_transformers():
    cfg = ModelConfig.from_dict({"num_hidden_layers": 8, "index_topk_freq": 2, "pad_token_id": 0})
    assert cfg.mlp_layer_types == ("dense",) * 3 + ("sparse",) * 5
    assert cfg.mla_layers == (3, 7)
    assert cfg.indexer_types[:4] == ("full", "full", "shared", "full")
    from transformers import Glm5NextTextConfig

    ref = Glm5NextTextConfig(num_hidden_layers=8, index_topk_freq=2, pad_token_id=0)
    assert list(cfg.indexer_types) == ref.indexer_types
    assert list(cfg.layer_types) == ref.layer_types


@pytest.mark.parametrize("alias,kind", [("deepseek_sparse_attention", "indexed_attention"),
                                        ("qwen_sparse_attention", "indexed_attention"),
                                        ("full_attention", "indexed_attention"), ("mamba", "linear_attention")])
def test_layer_type_aliases_map_as_transformers_maps_them(alias, kind):
    from transformers import Glm5NextConfig

    types = ["linear_attention"] * 3 + [alias]
    raw = {"model_type": "glm5_next", "text_config": {"num_hidden_layers": 4, "layer_types": types}}
    cfg = ModelConfig.from_dict(raw)
    assert cfg.layer_types[3] == kind and cfg.mla_layers == ((3,) if kind == "indexed_attention" else ())
    assert list(cfg.layer_types) == Glm5NextConfig(text_config=raw["text_config"]).text_config.layer_types


def test_num_nextn_predict_layers_is_checked():
    assert ModelConfig.from_dict({"num_hidden_layers": 4, "num_nextn_predict_layers": 1}).num_nextn_predict_layers == 1
    with pytest.raises(UnsupportedConfigError, match="num_nextn_predict_layers"):
        ModelConfig.from_dict({"num_hidden_layers": 4, "num_nextn_predict_layers": -1})


def test_sharded_checkpoint_and_bf16_load(tiny, tmp_path):
    path = _copy(tiny, tmp_path)
    tensors = load_file(str(path / "model.safetensors"))
    (path / "model.safetensors").unlink()
    names = sorted(tensors)
    half = len(names) // 2
    weight_map = {}
    for i, part in enumerate((names[:half], names[half:])):
        fname = f"model-0000{i + 1}-of-00002.safetensors"
        save_file({k: tensors[k] for k in part}, str(path / fname))
        weight_map.update({k: fname for k in part})
    (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    prompt = random_prompts([30])[0]
    ref = _load(tiny("default"))
    full = prefill_logits(ref, prompt)
    assert torch.equal(prefill_logits(_load(path), prompt), full)
    low = _load(path, dtype="bfloat16")
    # every weight is the checkpoint's rounded once to bf16, or kept exactly where the model keeps fp32
    p32 = dict(ref.engine.executor.runner.model.named_parameters())
    p16 = dict(low.engine.executor.runner.model.named_parameters())
    assert p16.keys() == p32.keys()
    for name, w in p16.items():
        assert w.dtype in (torch.bfloat16, torch.float32) and torch.equal(w, p32[name].to(w.dtype)), name
    bf16 = prefill_logits(low, prompt)
    assert bf16.shape == full.shape and torch.isfinite(bf16).all()
    # the random tiny model is chaotic in bf16 (a flipped routing or selection choice moves the rest):
    # greedy agreement with fp32 measured 0.62-0.87 over five prompts; a loose sanity bound only
    assert (bf16.argmax(-1) == full.argmax(-1)).float().mean() >= 0.5
