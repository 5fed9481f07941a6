"""Small checkpoints in the published GLM-5.3-Flash layouts (docs/checkpoints.md), for the weight-map tests.

The names, shapes and dtypes are written from the published tables, not from tpserve's own parameter list:
the BF16 build (F32 only for A_log, dt_bias, hc_*_base / hc_*_scale, e_score_correction_bias), the FP8
block-128 build, NVIDIA's ModelOpt NVFP4 build and the mixed W4A16-NVFP4-K32 + FP8-WO build, with or without
the MTP layer (layer num_hidden_layers: no hc_*, no embed_tokens / shared_head.head), always with a vision
tower (`model.visual.*`, which tpserve skips). The config is the published one
(fixtures/glm53_flash/config.json) at small widths: 4 layers (KDA + dense MLP at 0-2, MLA + MoE at 3).
Values are random; quantized tensors hold random codes and scales in their stored dtypes.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import torch
from safetensors.torch import save_file

FIXTURE = Path(__file__).parent / "fixtures" / "glm53_flash" / "config.json"
LAYERS = 4
TEXT = "model.language_model."
FLAVOURS = ("bf16", "fp8", "nvfp4", "mixed")
SMALL = dict(vocab_size=320, hidden_size=256, intermediate_size=384, moe_intermediate_size=128,
             num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8, num_experts_per_tok=2,
             q_lora_rank=128, kv_lora_rank=64, qk_head_dim=32, qk_nope_head_dim=32, v_head_dim=32,
             index_n_heads=4, index_head_dim=32, index_topk=16, eos_token_id=[316, 317], pad_token_id=316,
             max_position_embeddings=4096)
SMALL_LINEAR = dict(num_heads=4, head_dim=32)
SMALL_VISION = dict(depth=1, hidden_size=32, num_heads=2, intermediate_size=64, out_hidden_size=256)
F32_SUFFIXES = ("A_log", "dt_bias", "hc_attn_base", "hc_ffn_base", "hc_attn_scale", "hc_ffn_scale",
                "e_score_correction_bias")

# which modules (layer-relative) each quantized build stores quantized
_MLA = ("self_attn.q_a_proj", "self_attn.kv_a_proj_with_mqa", "self_attn.q_b_proj", "self_attn.kv_b_proj",
        "self_attn.o_proj")
_SHARED = ("mlp.shared_experts.gate_proj", "mlp.shared_experts.up_proj", "mlp.shared_experts.down_proj")
# official FP8: q_a, q_b, dense MLP confirmed FP8, kv_b BF16; kv_a, MLA o_proj, indexer wk, experts indicated;
# shared experts assumed FP8 as in DeepSeek-V3; KDA and the router BF16
FP8_MODULES = ("self_attn.q_a_proj", "self_attn.q_b_proj", "self_attn.kv_a_proj_with_mqa", "self_attn.o_proj",
               "self_attn.indexer.wk", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj") + _SHARED
# mixed build, FP8 weight-only on L0..L-1: KDA q, k, v, o; all five MLA projections; shared experts (the modules
# whose full-width dims are multiples of 256)
MIXED_FP8 = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj") + _MLA + _SHARED
MIXED_IGNORE = ["lm_head", "model.embed_tokens", "model.language_model.embed_tokens", "*.embed_tokens",
                "*.self_attn.indexer.*", "*.mlp.gate", "*.mlp.gate_up_proj", "*.mlp.gate_proj", "*.mlp.up_proj",
                "*.mlp.down_proj", "*.eh_proj", "*.shared_head.*", "model.visual.*", "visual.*", "*.visual.*"]


def published_config() -> dict:
    """The published config.json, full width (45 layers)."""
    return json.loads(FIXTURE.read_text())


def config(mtp: bool) -> dict:
    """The published config.json cut to LAYERS layers and small widths (its keys and spellings kept)."""
    raw = published_config()
    t = raw["text_config"]
    t.update(copy.deepcopy(SMALL), num_hidden_layers=LAYERS, num_nextn_predict_layers=1 if mtp else 0)
    for key in ("layer_types", "mlp_layer_types", "indexer_types"):
        t[key] = t[key][:LAYERS]
    lin = t["linear_attn_config"]
    lin.update(SMALL_LINEAR)
    lin["kda_layers"] = [i for i in lin["kda_layers"] if i < LAYERS]
    lin["full_attn_layers"] = [i for i in lin["full_attn_layers"] if i < LAYERS]
    raw["vision_config"].update(SMALL_VISION)
    return raw


def text_layout(cfg: dict, mtp: bool) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of every text-tower tensor of the BF16 build; the MTP layer's last."""
    t = cfg["text_config"]
    d, lin, hc, n = t["hidden_size"], t["linear_attn_config"], t["hc_mult"], t["num_hidden_layers"]
    qkv, dh = lin["num_heads"] * lin["head_dim"], lin["head_dim"]
    out = [("embed_tokens.weight", (t["vocab_size"], d)), ("norm.weight", (d,))]
    for layer in range(n + (1 if mtp else 0)):
        p = f"layers.{layer}."
        rows = [("input_layernorm.weight", (d,)), ("post_attention_layernorm.weight", (d,))]
        if layer == n:  # the MTP layer: plain residual block, MLA + MoE
            rows += [("enorm.weight", (d,)), ("hnorm.weight", (d,)), ("eh_proj.weight", (d, 2 * d)),
                     ("shared_head.norm.weight", (d,))]
            rows += _mla(t) + _moe(t)
        else:
            for site in ("attn", "ffn"):
                rows += [(f"hc_{site}_fn", ((2 + hc) * hc, hc * d)), (f"hc_{site}_base", ((2 + hc) * hc,)),
                         (f"hc_{site}_scale", (3,))]
            kda = layer in lin["kda_layers"]
            rows += _kda(d, qkv, dh, lin) if kda else _mla(t)
            rows += _dense(t) if t["mlp_layer_types"][layer] == "dense" else _moe(t)
        out += [(p + n, s) for n, s in rows]
    return [(TEXT + n, s) for n, s in out] + [("lm_head.weight", (t["vocab_size"], d))]


def _kda(d: int, qkv: int, dh: int, lin: dict) -> list:
    a = "self_attn."
    k = lin["short_conv_kernel_size"]
    rows = [(f"{a}{x}_proj.weight", (qkv, d)) for x in "qkv"] + [(f"{a}{x}_conv1d.weight", (qkv, 1, k)) for x in "qkv"]
    rows += [(a + "f_a_proj.weight", (dh, d)), (a + "f_b_proj.weight", (qkv, dh)), (a + "g_a_proj.weight", (dh, d)),
             (a + "g_b_proj.weight", (qkv, dh)), (a + "b_proj.weight", (lin["num_heads"], d)),
             (a + "o_proj.weight", (d, qkv)), (a + "o_norm.weight", (dh,)), (a + "A_log", (lin["num_heads"],)),
             (a + "dt_bias", (qkv,))]
    return rows


def _mla(t: dict) -> list:
    a, d, h, ih = "self_attn.", t["hidden_size"], t["num_attention_heads"], t["index_head_dim"]
    qa, kva, kv_b = t["q_lora_rank"], t["kv_lora_rank"], h * (t["qk_nope_head_dim"] + t["v_head_dim"])
    return [(a + "q_a_proj.weight", (qa, d)), (a + "q_a_layernorm.weight", (qa,)),
            (a + "q_b_proj.weight", (h * t["qk_head_dim"], qa)), (a + "kv_a_proj_with_mqa.weight", (kva, d)),
            (a + "kv_a_layernorm.weight", (kva,)), (a + "kv_b_proj.weight", (kv_b, kva)),
            (a + "o_proj.weight", (d, h * t["v_head_dim"])),
            (a + "indexer.wq_b.weight", (t["index_n_heads"] * ih, qa)), (a + "indexer.wk.weight", (ih, d)),
            (a + "indexer.weights_proj.weight", (t["index_n_heads"], d)), (a + "indexer.k_norm.weight", (ih,)),
            (a + "indexer.k_norm.bias", (ih,)), (a + "indexer.index_kpool_compress_ape", (t["index_kpool"], ih)),
            (a + "indexer.index_kpool_compress_gate", (ih, d))]


def _dense(t: dict) -> list:
    d, i = t["hidden_size"], t["intermediate_size"]
    return [("mlp.gate_proj.weight", (i, d)), ("mlp.up_proj.weight", (i, d)), ("mlp.down_proj.weight", (d, i))]


def _moe(t: dict) -> list:
    d, i, e = t["hidden_size"], t["moe_intermediate_size"], t["n_routed_experts"]
    si = i * t["n_shared_experts"]
    rows = [("mlp.gate.weight", (e, d)), ("mlp.gate.e_score_correction_bias", (e,)),
            ("mlp.shared_experts.gate_proj.weight", (si, d)), ("mlp.shared_experts.up_proj.weight", (si, d)),
            ("mlp.shared_experts.down_proj.weight", (d, si))]
    for x in range(e):
        rows += [(f"mlp.experts.{x}.gate_proj.weight", (i, d)), (f"mlp.experts.{x}.up_proj.weight", (i, d)),
                 (f"mlp.experts.{x}.down_proj.weight", (d, i))]
    return rows


def vision_layout(cfg: dict) -> list[tuple[str, tuple[int, ...]]]:
    """The vision tower's names (depth from the config; tpserve skips them)."""
    v = cfg["vision_config"]
    w, f, o = v["hidden_size"], v["intermediate_size"], v["out_hidden_size"]
    rows = [("patch_embed.proj.weight", (w, 3, 2, 14, 14)), ("patch_embed.proj.bias", (w,)),
            ("post_layernorm.weight", (w,)), ("downsample.weight", (o, w, 2, 2)), ("downsample.bias", (o,)),
            ("merger.proj.weight", (o, o)), ("merger.gate_proj.weight", (f, o)), ("merger.up_proj.weight", (f, o)),
            ("merger.down_proj.weight", (o, f)), ("merger.post_projection_norm.weight", (o,)),
            ("merger.post_projection_norm.bias", (o,))]
    for b in range(v["depth"]):
        p = f"blocks.{b}."
        rows += [(p + "norm1.weight", (w,)), (p + "norm2.weight", (w,)), (p + "attn.qkv.weight", (3 * w, w)),
                 (p + "attn.qkv.bias", (3 * w,)), (p + "attn.proj.weight", (w, w)), (p + "attn.proj.bias", (w,)),
                 (p + "attn.q_norm.weight", (w // v["num_heads"],)), (p + "attn.k_norm.weight", (w // v["num_heads"],))]
        rows += [(p + f"mlp.{x}_proj.weight", (f, w) if x != "down" else (w, f)) for x in ("gate", "up", "down")]
        rows += [(p + f"mlp.{x}_proj.bias", (f,) if x != "down" else (w,)) for x in ("gate", "up", "down")]
    return [("model.visual." + n, s) for n, s in rows]


def _value(name: str, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    """Random values a forward can run on: norms near 1, KDA decay parameters in their ranges."""
    randn = torch.randn(shape, generator=gen)
    if name.endswith("A_log"):
        return torch.empty(shape).uniform_(1.0, 16.0, generator=gen).log()
    if name.endswith("dt_bias"):
        return -4.0 + 0.5 * randn
    if name.endswith(("norm.weight", "layernorm.weight", "_scale")):
        return 1.0 + 0.1 * randn
    if name.endswith(("_base", "bias", "compress_ape")) or "conv" in name or "embed_tokens" in name:
        return 0.5 * randn
    return randn / math.sqrt(shape[-1])


def _layer(name: str) -> tuple[int | None, str]:
    """(layer index, the module path inside it) of a text-tower name."""
    if not name.startswith(TEXT + "layers."):
        return None, name
    idx, rest = name[len(TEXT + "layers."):].split(".", 1)
    return int(idx), rest


def _fp8(w: torch.Tensor, gen: torch.Generator) -> dict[str, torch.Tensor]:
    n, k = w.shape
    scale = torch.rand(-(-n // 128), -(-k // 128), generator=gen) / (2 * math.sqrt(k)) + 1e-3
    return {"weight": (2 * torch.randn(n, k, generator=gen)).to(torch.float8_e4m3fn), "weight_scale_inv": scale}


def _nvfp4(w: torch.Tensor, gen: torch.Generator, group: int, scale2: float | None,
           input_scale: float | None) -> dict[str, torch.Tensor]:
    n, k = w.shape
    s2 = scale2 if scale2 is not None else 1.0 / (2.5 * math.sqrt(k)) * (0.5 + float(torch.rand((), generator=gen)))
    act = input_scale if input_scale is not None else 0.1 + float(torch.rand((), generator=gen))
    return {"weight": torch.randint(0, 256, (n, k // 2), generator=gen, dtype=torch.uint8),
            "weight_scale": (0.5 + torch.rand(n, k // group, generator=gen)).to(torch.float8_e4m3fn),
            "weight_scale_2": torch.tensor(s2, dtype=torch.float32), "input_scale": torch.tensor(act)}


def _quantized(flavour: str, layer: int | None, module: str, kda: bool) -> str:
    """The stored layout ('bf16', 'fp8', 'nvfp4') of `module` (layer-relative, no `.weight`) in a build; `kda`:
    the layer is a KDA layer (its o_proj is not MLA's)."""
    if layer is None or flavour == "bf16":
        return "bf16"
    mtp, expert = layer == LAYERS, ".experts." in module
    if flavour == "fp8":  # KDA stays BF16
        return "fp8" if expert or module in FP8_MODULES and not (kda and module.startswith("self_attn.")) else "bf16"
    if flavour == "nvfp4":  # experts and dense MLPs; the MTP layer stays BF16
        dense = module in ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
        return "nvfp4" if not mtp and (expert or dense) else "bf16"
    if expert:  # mixed: experts of every MoE layer, MTP included
        return "nvfp4"
    return "fp8" if not mtp and module in MIXED_FP8 else "bf16"


def state_dict(flavour: str, mtp: bool, seed: int = 0) -> dict[str, torch.Tensor]:
    cfg = config(mtp)
    kda_layers = cfg["text_config"]["linear_attn_config"]["kda_layers"]
    gen = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    shared_s2: dict[str, float] = {}
    for name, shape in text_layout(cfg, mtp) + vision_layout(cfg):
        value = _value(name, shape, gen)
        layer, rest = _layer(name)
        module = rest[:-len(".weight")] if rest.endswith(".weight") else rest
        kind = _quantized(flavour, layer, module, layer in kda_layers)
        if kind == "bf16":
            out[name] = value.to(torch.float32 if name.endswith(F32_SUFFIXES) else torch.bfloat16)
            continue
        base = name[:-len(".weight")]
        if kind == "fp8":
            parts = _fp8(value, gen)
        elif flavour == "mixed":  # W4A16, group 32; gate and up quantized jointly: one weight_scale_2 for both
            key = base.replace(".up_proj", ".gate_proj")
            parts = _nvfp4(value, gen, 32, shared_s2.get(key), input_scale=1.0)
            shared_s2.setdefault(key, float(parts["weight_scale_2"]))
        else:  # NVIDIA's W4A4: a calibrated activation scale per module
            parts = _nvfp4(value, gen, 16, None, None)
        out.update({f"{base}.{k}": v for k, v in parts.items()})
    return out


def quantization_config(flavour: str, tensors: dict[str, torch.Tensor]) -> tuple[dict | None, dict | None]:
    """(config.json's quantization_config, hf_quant_config.json) of a build; the mixed build's `quantized_layers`
    name its FP8 modules and expert 0 of each MoE layer, under both published namespaces."""
    if flavour == "fp8":  # DeepSeek-style block FP8; modules_to_not_convert as a published fixture has it
        return {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128],
                "modules_to_not_convert": ["lm_head", "model.layers.0.self_attn.A_log"]}, None
    producer = {"name": "modelopt", "version": "0.47.0.dev393"}
    if flavour == "nvfp4":
        group = {"dynamic": False, "num_bits": 4, "type": "float", "group_size": 16}
        layers = {n[:-len(".weight_scale")]: {"quant_algo": "NVFP4"} for n in tensors if n.endswith(".weight_scale")}
        return ({"quant_method": "modelopt", "quant_algo": "NVFP4", "producer": producer,
                 "config_groups": {"group_0": {"weights": group, "input_activations": group, "targets": ["Linear"]}},
                 "ignore": ["lm_head", "*.self_attn*", "*.shared_experts*", "*.mlp.gate", "model.visual*"],
                 "kv_cache_scheme": {"dynamic": False, "num_bits": 8, "type": "float"}},
                {"producer": producer, "quantization": {"quant_algo": "MIXED_PRECISION", "kv_cache_quant_algo": "FP8",
                                                         "quantized_layers": layers}})
    if flavour == "mixed":
        layers = {}
        for n in tensors:
            m = n[len(TEXT):].rsplit(".", 1)[0]
            if n.endswith(".weight_scale_inv"):
                entry = {"quant_algo": "FP8_PB_WO"}
            elif n.endswith(".weight_scale") and ".experts.0." in n:
                entry = {"quant_algo": "W4A16_NVFP4", "group_size": 32}
            else:
                continue
            layers[TEXT + m] = layers["model." + m] = entry
        return ({"quant_algo": "MIXED_PRECISION", "kv_cache_scheme": None, "quant_method": "modelopt_mixed",
                 "ignore": MIXED_IGNORE, "quantized_layers": layers, "producer": producer,
                 "packed_modules_mapping": {"gate_up_proj": ["gate_proj", "up_proj"],
                                            "qkv_proj": ["q_proj", "k_proj", "v_proj"],
                                            "fused_qkv_a_proj_with_mqa": ["q_a_proj", "kv_a_proj_with_mqa"]}}, None)
    return None, None


def write(root: Path, flavour: str, mtp: bool, seed: int = 0, tensors: dict | None = None) -> Path:
    """A checkpoint directory of `flavour` (sharded in two files with an index, as the published ones are)."""
    out = Path(root) / f"{flavour}{'-mtp' if mtp else ''}"
    out.mkdir(parents=True, exist_ok=True)
    tensors = state_dict(flavour, mtp, seed) if tensors is None else tensors
    raw = config(mtp)
    qcfg, hf = quantization_config(flavour, tensors)
    if qcfg is not None:
        raw["quantization_config"] = qcfg
    (out / "config.json").write_text(json.dumps(raw, indent=1))
    if hf is not None:
        (out / "hf_quant_config.json").write_text(json.dumps(hf, indent=1))
    names = sorted(tensors)
    half = len(names) // 2
    weight_map = {}
    for i, part in enumerate((names[:half], names[half:])):
        fname = f"model-{i + 1:05d}-of-00002.safetensors"
        save_file({k: tensors[k].contiguous() for k in part}, str(out / fname), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, fname))
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return out
