"""Weight maps of the published GLM-5.3-Flash checkpoint layouts (docs/checkpoints.md).

Small checkpoints written from the published names, shapes and dtypes (published_layouts.py: BF16, FP8 block
128, NVIDIA ModelOpt NVFP4, the mixed W4A16-NVFP4-K32 + FP8-WO build; each with and without the MTP layer, each
with a vision tower) load through tpserve's loader with every tensor consumed: each lands, value for value, in
the parameter its name maps to, none is missing, and the only tensors left unread are the vision tower, the
ModelOpt `input_scale`s and, without speculative decoding, the MTP layer. Each flavour also runs greedy decoding
on the CPU with its MTP drafter (the CPU runs FP8 and NVFP4 by dequantizing). A missing, mis-shaped or unexpected
tensor fails with the one-line error today's loader gives.
"""

import pytest
import torch
from safetensors import safe_open

import published_layouts as pl
from tpserve import LLM, SamplingParams
from tpserve.kernels.choice import Kernels
from tpserve.model.build import plan_model
from tpserve.model.config import ModelConfig, UnsupportedConfigError
from tpserve.model.layers import ShardContext
from tpserve.model.loader import CheckpointError, checkpoint_files, internal_name, load_weights
from tpserve.model.weights import checkpoint_sources

L = f"{pl.TEXT}layers."


@pytest.fixture(scope="module")
def layouts(tmp_path_factory):
    root, made = tmp_path_factory.mktemp("published"), {}

    def get(flavour: str, mtp: bool):
        if (flavour, mtp) not in made:
            made[flavour, mtp] = pl.write(root, flavour, mtp)
        return made[flavour, mtp]

    return get


def _load(path, mtp: bool):
    """The model as the engine plans it, with the checkpoint's tensors copied in (before any processing)."""
    cfg = ModelConfig.from_file(path)
    model, qc, plan = plan_model(path, cfg, ShardContext.single(torch.float32), Kernels(), mtp=mtp)
    model.to_empty(device="cpu")
    load_weights(model, path, num_layers=cfg.num_hidden_layers, mtp=mtp)
    return model, qc, plan


def _tensors(path):
    out = {}
    for f in checkpoint_files(path):
        with safe_open(str(f), "pt") as st:
            out.update({n: st.get_tensor(n) for n in st.keys()})
    return out


def _skipped_because(name: str, mtp: bool) -> str:
    if name.startswith("model.visual."):
        return "vision"
    if name.endswith(".input_scale"):
        return "input_scale"
    if not mtp and name.startswith(f"{L}{pl.LAYERS}."):
        return "mtp"
    return ""


def test_the_generator_gives_the_published_counts_and_shapes():
    """At full width the generator's names are the published ones: 37,534 text tensors, 889 in the MTP layer,
    347 in the vision tower, and the shapes of the published table."""
    cfg = pl.published_config()
    main, with_mtp = dict(pl.text_layout(cfg, False)), dict(pl.text_layout(cfg, True))
    assert (len(main), len(with_mtp) - len(main), len(pl.vision_layout(cfg))) == (37_534, 889, 347)
    assert not [n for n in with_mtp if n.startswith(f"{L}45.hc_")]
    expected = {"3.self_attn.q_b_proj.weight": (16384, 1536), "3.self_attn.kv_b_proj.weight": (32768, 512),
                "3.self_attn.kv_a_proj_with_mqa.weight": (512, 4096), "0.hc_attn_fn": (24, 16384),
                "0.hc_ffn_base": (24,), "0.hc_ffn_scale": (3,), "0.self_attn.q_conv1d.weight": (8192, 1, 4),
                "0.self_attn.f_b_proj.weight": (8192, 128), "0.self_attn.b_proj.weight": (64, 4096),
                "3.self_attn.indexer.index_kpool_compress_ape": (4, 128),
                "3.self_attn.indexer.wq_b.weight": (4096, 1536),
                "44.mlp.experts.287.down_proj.weight": (4096, 2048), "0.mlp.down_proj.weight": (4096, 12288),
                "45.eh_proj.weight": (4096, 8192)}
    assert {k: with_mtp[L + k] for k in expected} == expected
    assert with_mtp["lm_head.weight"] == (154880, 4096)


@pytest.mark.parametrize("mtp_layer", [False, True], ids=["main", "with-mtp"])
@pytest.mark.parametrize("flavour", pl.FLAVOURS)
def test_every_published_tensor_lands_in_its_parameter(layouts, flavour, mtp_layer):
    path = layouts(flavour, mtp_layer)
    stored = _tensors(path)
    for mtp in sorted({False, mtp_layer}):
        model, qc, plan = _load(path, mtp)
        sources = checkpoint_sources(model)
        consumed = set()
        for name, value in stored.items():
            internal = internal_name(name, pl.LAYERS, mtp)
            if internal is None or internal not in sources:
                assert _skipped_because(name, mtp), f"{name} is read by nothing"
                continue
            consumed.add(internal)
            module, src = sources[internal]
            target = getattr(module, src.target)[src.index]
            if src.repeat > 1:  # a group-32 NVFP4 scale fills two columns of the 16-wide layout
                assert (flavour, src.repeat) == ("mixed", 2) and name.endswith(".weight_scale"), name
                value = value.repeat_interleave(2, dim=-1)
            assert tuple(target.shape) == tuple(value.shape), name
            if value.dtype in (torch.float8_e4m3fn, torch.uint8):  # stored bits, never converted
                assert target.dtype == value.dtype and torch.equal(target.view(torch.uint8),
                                                                   value.view(torch.uint8)), name
            else:
                assert torch.equal(target, value.to(target.dtype)), name
        assert consumed == set(sources), f"never filled: {sorted(set(sources) - consumed)[:5]}"
        stored_as = {"bf16": {"bf16"}, "fp8": {"bf16", "fp8"}, "nvfp4": {"bf16", "nvfp4"},
                     "mixed": {"bf16", "fp8", "nvfp4"}}
        assert set(plan.values()) == stored_as[flavour]
        assert qc.method == flavour
        if mtp:  # NVIDIA's build keeps the MTP layer in BF16, the mixed build quantizes its experts
            assert plan["mtp.mlp.experts"] == {"nvfp4": "bf16", "mixed": "nvfp4"}.get(flavour, flavour)


@pytest.mark.parametrize("flavour", pl.FLAVOURS)
def test_published_layout_decodes_greedily_with_its_drafter(layouts, flavour):
    """The engine on the CPU (quantized linears and experts are dequantized there) serves each flavour with its
    MTP layer drafting: a prefill, a draft and a verify step run on the published layout."""
    path = layouts(flavour, True)
    llm = LLM(str(path), device="cpu", kv_cache_memory="4MiB", skip_tokenizer_init=True,
              speculative_config={"method": "mtp", "num_speculative_tokens": 1})
    model = llm.engine.executor.runner.model
    assert model.mtp.mlp.experts.quant.name == {"nvfp4": "bf16", "mixed": "nvfp4"}.get(flavour, flavour)
    out = llm.generate([{"prompt_token_ids": [5, 17, 99, 230, 7]}],
                       SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))[0].outputs[0].token_ids
    assert len(out) == 2 and all(0 <= t < pl.SMALL["vocab_size"] for t in out)


def _drop(name):
    return lambda t: t.pop(name)


def _shrink(name):
    return lambda t: t.__setitem__(name, t[name][:-1].clone())


def _add(name, value):
    return lambda t: t.__setitem__(name, value)


MISMATCHES = [
    ("bf16", False, _drop(f"{L}3.self_attn.indexer.index_kpool_compress_ape"), CheckpointError,
     r"^missing tensor\(s\) in checkpoint: model\.language_model\.layers\.3\.self_attn\.indexer\."
     r"index_kpool_compress_ape$"),
    ("bf16", False, _shrink(f"{L}0.hc_ffn_fn"), CheckpointError,
     r"^model\.language_model\.layers\.0\.hc_ffn_fn: shape \[23, 1024\] does not match the config, "
     r"expected \[24, 1024\]$"),
    ("bf16", False, _add(f"{L}3.mlp.experts.8.up_proj.weight", torch.zeros(128, 256, dtype=torch.bfloat16)),
     CheckpointError, r"^unexpected tensor\(s\) in checkpoint: .*layers\.3\.mlp\.experts\.8\.up_proj\.weight$"),
    ("bf16", True, _drop(f"{L}4.hnorm.weight"), CheckpointError,
     r"^missing tensor\(s\) in checkpoint: model\.language_model\.layers\.4\.hnorm\.weight$"),
    ("bf16", True, _add(f"{L}4.hc_attn_fn", torch.zeros(24, 1024, dtype=torch.bfloat16)), CheckpointError,
     r"^model\.language_model\.layers\.4\.hc_attn_fn: the MTP layer \(layer 4\) is in the pre-release mHC layout"),
    ("fp8", False, _shrink(f"{L}3.self_attn.q_b_proj.weight"), CheckpointError,
     r"^model\.language_model\.layers\.3\.self_attn\.q_b_proj\.weight: shape \[127, 128\] does not match"),
    ("fp8", False, _drop(f"{L}3.mlp.experts.6.down_proj.weight_scale_inv"), UnsupportedConfigError,
     r"^layers\.3\.mlp\.experts\.6\.down_proj\.weight: stored as F8_E4M3 without a weight_scale_inv"),
    ("nvfp4", False, _shrink(f"{L}3.mlp.experts.5.down_proj.weight_scale"), CheckpointError,
     r"^model\.language_model\.layers\.3\.mlp\.experts\.5\.down_proj\.weight_scale: shape \[255, 8\] does not"),
    ("nvfp4", False, _add(f"{L}0.self_attn.q_proj.weight_scale", torch.ones(128, 16).to(torch.float8_e4m3fn)),
     CheckpointError, r"^unexpected tensor\(s\) in checkpoint: .*layers\.0\.self_attn\.q_proj\.weight_scale$"),
    ("mixed", True, _drop(f"{L}4.mlp.experts.1.gate_proj.weight_scale"), UnsupportedConfigError,
     r"^mtp\.mlp\.experts\.1\.gate_proj\.weight: stored as uint8 without weight_scale and weight_scale_2"),
    ("mixed", False, _add(f"{L}3.mlp.experts.2.up_proj.weight_scale", torch.ones(128, 16).to(torch.float8_e4m3fn)),
     CheckpointError, r"^model\.language_model\.layers\.3\.mlp\.experts\.2\.up_proj\.weight_scale: shape \[128, 16\] "
                      r"does not match the config, expected \[128, 8\]$"),
]


@pytest.mark.parametrize(("flavour", "mtp", "edit", "error", "match"), MISMATCHES,
                         ids=[f"{m[0]}-{i}" for i, m in enumerate(MISMATCHES)])
def test_a_real_mismatch_is_a_one_line_error(layouts, tmp_path, flavour, mtp, edit, error, match):
    tensors = _tensors(layouts(flavour, mtp))
    edit(tensors)
    path = pl.write(tmp_path, flavour, mtp, tensors=tensors)
    with pytest.raises(error) as info:
        _load(path, mtp)
    assert "\n" not in str(info.value)
    assert info.match(match)
