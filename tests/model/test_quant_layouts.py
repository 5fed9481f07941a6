"""Quantized layouts: round trips, the exact tensor names / dtypes / shapes written, TP sharding of
weights with their block scales, and the errors (unknown method, a split that cuts a block, a
quantized tensor going into an unquantized layer)."""

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from tpserve.kernels.quant import ref as qr
from tpserve.kernels.choice import Kernels, WeightOptions
from tpserve.model.build import build_model
from tpserve.model.config import ModelConfig, UnsupportedConfigError
from tpserve.model.layers import ShardContext
from tpserve.model.loader import CheckpointError
from tpserve.model.quant_config import read_quant_config
from tpserve.tools.quantize import quantize_checkpoint


@pytest.mark.parametrize(("n", "k", "block"), [(256, 384, (128, 128)), (200, 130, (128, 128)), (48, 64, (16, 16))])
def test_fp8_block_round_trip(n, k, block):
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(n)) / k**0.5
    q, s = qr.fp8_block_quantize(w, block)
    assert q.dtype == torch.float8_e4m3fn and s.dtype == torch.float32
    assert s.shape == (-(-n // block[0]), -(-k // block[1]))
    back = qr.fp8_block_dequantize(q, s, block)
    # e4m3 keeps 3 mantissa bits: relative step 2^-3, so rounding error <= 2^-4 of the block's largest value
    tile_max = qr.fp8_block_dequantize(torch.ones_like(q, dtype=torch.float32).to(torch.float8_e4m3fn), s * 448, block)
    assert ((back - w).abs() <= tile_max * 2**-4 + 1e-12).all()


def test_nvfp4_layout_and_round_trip():
    w = torch.randn(32, 64, generator=torch.Generator().manual_seed(0))
    packed, bscale, s2 = qr.nvfp4_quantize(w)
    assert (packed.dtype, tuple(packed.shape)) == (torch.uint8, (32, 32))
    assert (bscale.dtype, tuple(bscale.shape)) == (torch.float8_e4m3fn, (32, 4))
    assert (s2.dtype, tuple(s2.shape)) == (torch.float32, ())
    # low nibble first: element 0 of row 0 is byte 0's low 4 bits
    codes = qr.e2m1_encode(w / (bscale.float().repeat_interleave(16, 1) * s2))
    assert int(packed[0, 0]) == int(codes[0, 0]) | (int(codes[0, 1]) << 4)
    back = qr.nvfp4_dequantize(packed, bscale, s2)
    # in units of the group's scale (fp8 block scale x global scale) e2m1 steps are at most 2 (4 -> 6), so
    # rounding is off by <= 1 unit; values the fp8-rounded scale puts past 6 are clamped to 6 units
    unit = bscale.float().repeat_interleave(16, 1) * s2
    gmax = w.abs().view(32, 4, 16).amax(-1).repeat_interleave(16, 1)
    assert ((back - w).abs() <= unit * (1 + 1e-5) + (gmax - 6 * unit).clamp(min=0)).all()
    assert (qr.e2m1_decode(torch.arange(16, dtype=torch.uint8))[:8] == torch.tensor(qr.E2M1_VALUES)).all()


def test_quantize_writes_the_checkpoint_layouts(tiny, tmp_path):
    fp8 = quantize_checkpoint(tiny("default"), tmp_path / "fp8", "fp8")
    cfg = json.loads((fp8 / "config.json").read_text())["quantization_config"]
    assert cfg["quant_method"] == "fp8" and cfg["weight_block_size"] == [128, 128]
    with safe_open(str(fp8 / "model.safetensors"), "pt") as f:
        name = "model.language_model.layers.3.mlp.experts.2.up_proj"
        assert f.get_slice(name + ".weight").get_dtype() == "F8_E4M3"
        assert f.get_slice(name + ".weight_scale_inv").get_dtype() == "F32"
        assert f.get_slice(name + ".weight_scale_inv").get_shape() == [1, 1]
        assert f.get_slice("lm_head.weight").get_dtype() == "F32"
        assert f.get_slice("model.language_model.layers.0.self_attn.b_proj.weight").get_dtype() == "F32"  # 6 rows
    assert "model.language_model.layers.0.self_attn.b_proj" in cfg["modules_to_not_convert"]
    nv = quantize_checkpoint(tiny("default"), tmp_path / "nv", "nvfp4")
    cfg = json.loads((nv / "config.json").read_text())["quantization_config"]
    assert (cfg["quant_method"], cfg["quant_algo"], cfg["group_size"]) == ("modelopt", "NVFP4", 16)
    assert json.loads((nv / "hf_quant_config.json").read_text())["quantization"]["quant_algo"] == "NVFP4"
    with safe_open(str(nv / "model.safetensors"), "pt") as f:
        name = "model.language_model.layers.3.mlp.experts.2.down_proj"
        assert (f.get_slice(name + ".weight").get_dtype(), f.get_slice(name + ".weight").get_shape()) == ("U8", [64, 24])
        assert f.get_slice(name + ".weight_scale").get_shape() == [64, 3]
        assert f.get_slice(name + ".weight_scale_2").get_shape() == []
        assert f.get_slice(name + ".input_scale").get_shape() == []
        assert f.get_slice("model.language_model.layers.3.mlp.shared_experts.up_proj.weight").get_dtype() == "F32"


def _tp_model(path: Path, rank: int, world: int):
    from tpserve.collectives.comm import Communicator

    ctx = ShardContext(rank, world, torch.float32, Communicator(None, torch.device("cpu")))
    return build_model(path, ModelConfig.from_file(path), ctx, torch.device("cpu"), Kernels())


@pytest.mark.parametrize("method", ["fp8", "nvfp4"])
def test_tp_shards_carry_their_scales(tiny, tmp_path, method):
    """Each rank's dequantized piece equals the same slice of the whole dequantized weight."""
    from tpserve.model.tiny import make_tiny

    # tiny dims: fp8 block 8 divides 48 / 2; nvfp4 needs 16 | moe_intermediate_size / 2
    src = tiny("default") if method == "fp8" else make_tiny(tmp_path / "src", seed=5, moe_intermediate_size=64)
    q = quantize_checkpoint(src, tmp_path / method, method, block=8)
    full = _tp_model(q, 0, 1)
    ranks = [_tp_model(q, r, 2) for r in range(2)]
    if method == "fp8":
        whole = full.layers[0].self_attn.q_proj.dense_weight()
        pieces = [m.layers[0].self_attn.q_proj.dense_weight() for m in ranks]
        assert torch.equal(torch.cat(pieces, 0), whole)                              # column split
        whole = full.layers[0].self_attn.o_proj.dense_weight()
        assert torch.equal(torch.cat([m.layers[0].self_attn.o_proj.dense_weight() for m in ranks], 1), whole)  # row
    ex = [m.layers[3].mlp.experts for m in ranks]
    fx = full.layers[3].mlp.experts
    il = fx.dims[1] // 2
    for e in (0, 5):
        gu = [_expert_dense(x, e) for x in ex]
        fgu, fdn = _expert_dense(fx, e)
        gate = torch.cat([g[0][:il] for g in gu]), torch.cat([g[0][il:] for g in gu])
        assert torch.equal(torch.cat(gate), fgu)
        assert torch.equal(torch.cat([g[1] for g in gu], 1), fdn)


def _expert_dense(layer, e):
    """(gate|up [2I_local, D], down [D, I_local]) of expert e, dequantized, through the reference loop's hooks."""
    seen = {}
    from tpserve.kernels.moe import ref as moe_ops

    real = moe_ops.experts_loop_fn

    def grab(x, weights, ids, n, gate_up_of, down_of, limit):
        seen["w"] = (gate_up_of(e), down_of(e))
        return x

    moe_ops.experts_loop_fn = grab
    try:
        layer(torch.zeros(1, layer.dims[2]), torch.ones(1, 1), torch.tensor([[e]]))
    finally:
        moe_ops.experts_loop_fn = real
    return seen["w"]


def test_tp_split_that_cuts_a_block_is_refused(tiny, tmp_path):
    q = quantize_checkpoint(tiny("default"), tmp_path / "fp8", "fp8", block=128)
    with pytest.raises(ValueError, match="tensor_parallel_size=2 would cut a 128-wide quantization block"):
        _tp_model(q, 0, 2)


def test_unknown_method_and_mismatch_errors(tiny, tmp_path):
    from tpserve.config import EngineConfig

    with pytest.raises(ValueError, match="'awq'"):
        EngineConfig(quantization="awq")
    with pytest.raises(UnsupportedConfigError, match="no fp8 tensors"):
        build_model(tiny("default"), ModelConfig.from_file(tiny("default")), ShardContext.single(torch.float32),
                    torch.device("cpu"), Kernels(weights=WeightOptions(quantization="fp8")))
    q = quantize_checkpoint(tiny("default"), tmp_path / "fp8", "fp8")
    with pytest.raises(UnsupportedConfigError, match="--quantization nvfp4 but the checkpoint is fp8"):
        read_quant_config(q, "nvfp4")
    raw = json.loads((q / "config.json").read_text())
    raw["quantization_config"] = {"quant_method": "gptq", "bits": 4}
    (q / "config.json").write_text(json.dumps(raw))
    with pytest.raises(UnsupportedConfigError, match="'gptq' is not supported"):
        ModelConfig.from_file(q)


def test_detection_is_per_tensor_and_never_upcasts(tiny, tmp_path):
    """No quantization_config at all: the float8 tensors with a scale beside them are still fp8; a
    float8 tensor without its scale is refused rather than read as a plain weight."""
    from safetensors.torch import load_file, save_file

    q = quantize_checkpoint(tiny("default"), tmp_path / "fp8", "fp8")
    raw = json.loads((q / "config.json").read_text())
    del raw["quantization_config"]
    (q / "config.json").write_text(json.dumps(raw))
    model = _tp_model(q, 0, 1)
    assert model.layers[3].self_attn.indexer.wq_b.weight.dtype == torch.float8_e4m3fn   # 128 rows: quantized
    assert model.layers[3].self_attn.indexer.wq_b.quant.name == "fp8"
    tensors = load_file(str(q / "model.safetensors"))
    del tensors["model.language_model.layers.3.self_attn.indexer.wq_b.weight_scale_inv"]
    save_file(tensors, str(q / "model.safetensors"))
    with pytest.raises(UnsupportedConfigError, match="wq_b.weight: stored as F8_E4M3 without a weight_scale_inv"):
        _tp_model(q, 0, 1)
    # block 16 with no config to say so: the scale shapes do not fit the default 128 and are refused
    q16 = quantize_checkpoint(tiny("default"), tmp_path / "fp8-16", "fp8", block=16)
    raw = json.loads((q16 / "config.json").read_text())
    del raw["quantization_config"]
    (q16 / "config.json").write_text(json.dumps(raw))
    with pytest.raises(UnsupportedConfigError, match="does not fit block 128x128"):
        _tp_model(q16, 0, 1)


def test_quantized_tensor_into_plain_parameter_is_refused():
    from tpserve.model.loader import _check_dtype

    with pytest.raises(CheckpointError, match="never converted silently"):
        _check_dtype("x.weight", torch.float8_e4m3fn, torch.bfloat16)


def test_dense_fp8_converts_in_chunks(monkeypatch):
    from torch import nn

    from tpserve.model import quant_methods
    from tpserve.model.layers import Linear

    monkeypatch.setattr(quant_methods, "CHUNK_MIN_BYTES", 1000)
    monkeypatch.setattr(quant_methods, "CHUNK_ROWS", 7)
    layer = Linear(ShardContext.single(torch.float32), 32, 20)
    layer.set_quant(quant_methods.Fp8ChannelLinear(), "t")
    w = torch.randn(20, 32, generator=torch.Generator().manual_seed(0))
    layer.weight = nn.Parameter(w.clone(), requires_grad=False)
    layer.quant.after_load(layer)
    q, s = qr.fp8_channel_quantize(w)
    assert layer.weight.dtype == torch.float8_e4m3fn and torch.equal(layer.weight_scale, s)
    assert torch.equal(layer.weight.view(torch.uint8), q.view(torch.uint8))
    x = torch.randn(3, 32)
    torch.testing.assert_close(layer(x), x @ qr.fp8_channel_dequantize(q, s).T, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("method", ["fp8", "nvfp4"])
def test_dummy_load_format_builds_the_quantized_layout(tiny, method):
    from tpserve import LLM, SamplingParams

    llm = LLM(str(tiny("default")), device="cpu", load_format="dummy", quantization=method, kv_cache_memory="8MiB",
              block_size=16)
    model = llm.engine.executor.runner.model
    experts = model.layers[3].mlp.experts
    assert experts.quant.name == method
    assert experts.gate_up_proj.dtype == (torch.uint8 if method == "nvfp4" else torch.float8_e4m3fn)
    out = llm.generate([{"prompt_token_ids": [5, 6, 7]}], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    assert len(out[0].outputs[0].token_ids) == 3
    logits = model.layers[3].mlp(torch.randn(4, 64))
    assert torch.isfinite(logits).all() and logits.abs().max() > 0


@pytest.mark.parametrize("shard", ["column", "row"])
def test_nvfp4_group32_scales_fill_the_16_wide_layout(tmp_path, shard):
    """A checkpoint with one block scale per 32 input columns: every rank's dense weight is its slice of the
    weight dequantized with 32-wide groups (each stored scale fills two columns of the layout the kernels read)."""
    from safetensors.torch import save_file

    from tpserve.collectives.comm import Communicator
    from tpserve.model.layers import column, row
    from tpserve.model.loader import load_weights
    from tpserve.model.quant_methods import Nvfp4Linear

    gen = torch.Generator().manual_seed(0)
    n, k = 32, 128
    w = torch.randint(0, 256, (n, k // 2), generator=gen, dtype=torch.uint8)
    s = (0.5 + torch.rand(n, k // 32, generator=gen)).to(torch.float8_e4m3fn)
    s2 = torch.tensor(0.03)
    save_file({"weight": w, "weight_scale": s, "weight_scale_2": s2}, str(tmp_path / "model.safetensors"))
    whole = qr.e2m1_decode(qr.unpack_nibbles(w)) * s.float().repeat_interleave(32, -1) * s2
    pieces = []
    for rank in range(2):
        layer = (column if shard == "column" else row)(
            ShardContext(rank, 2, torch.float32, Communicator(None, torch.device("cpu"))), k, n)
        layer.set_quant(Nvfp4Linear(32), "t")
        assert tuple(layer.weight_scale.shape) == ((n // 2, k // 16) if shard == "column" else (n, k // 32))
        load_weights(layer, tmp_path, rank=rank, world=2, num_layers=1)
        pieces.append(layer.dense_weight(torch.float32))
    assert torch.equal(torch.cat(pieces, 0 if shard == "column" else 1), whole)


def test_modelopt_mixed_precision_config():
    from tpserve.model.quant import plan_for_dummy
    from tpserve.model.quant_config import parse_quant_config

    layers = {"model.layers.3.mlp.experts.0.up_proj": {"quant_algo": "W4A16_NVFP4", "group_size": 32},
              "model.layers.3.self_attn.o_proj": {"quant_algo": "FP8_PB_WO"}}
    qc = parse_quant_config({"quant_method": "modelopt_mixed", "quant_algo": "MIXED_PRECISION",
                             "quantized_layers": layers})
    assert (qc.method, qc.nvfp4_group, qc.fp8_block) == ("mixed", 32, (128, 128))
    assert qc.allows("fp8") and qc.allows("nvfp4") and not parse_quant_config(
        {"quant_method": "fp8", "weight_block_size": [128, 128]}).allows("nvfp4")
    # NVIDIA's hf_quant_config.json: MIXED_PRECISION of NVFP4 (group 16) layers only
    hf = {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "MIXED_PRECISION", "quantized_layers": {
        "model.language_model.layers.0.mlp.gate_proj": {"quant_algo": "NVFP4"}}}}
    assert (parse_quant_config(hf).method, parse_quant_config(hf).nvfp4_group) == ("mixed", 16)
    # ModelOpt's config.json form: the group size inside config_groups
    groups = {"group_0": {"weights": {"num_bits": 4, "group_size": 32}}}
    nvfp4 = {"quant_method": "modelopt", "quant_algo": "NVFP4"}
    assert parse_quant_config(dict(nvfp4, config_groups=groups)).nvfp4_group == 32
    bad = dict(layers, **{"model.layers.3.self_attn.q_a_proj": {"quant_algo": "W4A8_AWQ"}})
    with pytest.raises(UnsupportedConfigError, match=r"quantized_layers\.model\.layers\.3\.self_attn\.q_a_proj: "
                                                     r"quant_algo 'W4A8_AWQ' is not supported"):
        parse_quant_config({"quant_method": "modelopt_mixed", "quant_algo": "MIXED_PRECISION", "quantized_layers": bad})
    two = dict(layers, **{"model.layers.4.mlp.experts.0.up_proj": {"quant_algo": "NVFP4", "group_size": 16}})
    with pytest.raises(UnsupportedConfigError, match=r"nvfp4 group sizes \[16, 32\] differ"):
        parse_quant_config({"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION", "quantized_layers": two})
    with pytest.raises(UnsupportedConfigError, match="group_size must be a multiple of 16, got 24"):
        parse_quant_config(dict(nvfp4, group_size=24))
    with pytest.raises(UnsupportedConfigError, match="load_format dummy: a ModelOpt MIXED_PRECISION"):
        plan_for_dummy(None, qc)
