from pathlib import Path

import pytest

from tpserve.config import EngineConfig, parse_bytes, switch_table_markdown


def test_switch_table_is_current():
    text = (Path(__file__).parents[1] / "docs" / "switches.md").read_text()
    assert switch_table_markdown() in text


def test_env_then_keyword_precedence():
    cfg = EngineConfig.from_env({"TPSERVE_SP_MIN_TOKENS": "2048", "TPSERVE_SEQUENCE_PARALLEL": "off"})
    assert cfg.sp_min_tokens == 2048 and cfg.sequence_parallel is False
    cfg = EngineConfig.from_env({"TPSERVE_SP_MIN_TOKENS": "2048"}, sp_min_tokens=64)
    assert cfg.sp_min_tokens == 64


@pytest.mark.parametrize("env,match", [({"TPSERVE_MAX_NUM_SEQS": "lots"}, "TPSERVE_MAX_NUM_SEQS"),
                                       ({"TPSERVE_KDA_BACKEND": "cuda"}, "kda_backend"),
                                       ({"TPSERVE_TENSOR_PARALLEL_SIZE": "0"}, "tensor_parallel_size"),
                                       ({"TPSERVE_MOE_BACKEND": "cutlass"}, "moe_backend"),
                                       ({"TPSERVE_MOE_TRITON_MAX_TOKENS": "-1"}, "moe_triton_max_tokens")])
def test_bad_values_name_the_field(env, match):
    with pytest.raises(ValueError, match=match):
        EngineConfig.from_env(env)


def test_unknown_option_is_refused():
    with pytest.raises(TypeError, match="bogus"):
        EngineConfig.from_env({}, bogus=1)


def test_parse_bytes():
    assert parse_bytes("2GiB") == 2 * 2**30
    assert parse_bytes("512MB") == 512e6
    with pytest.raises(ValueError, match="kv_cache_memory"):
        parse_bytes("lots")


def test_kernel_choices_resolve_per_device(tiny):
    from tpserve.engine.setup import resolve_runtime
    from tpserve.kernels.choice import Kernels

    rt = resolve_runtime(EngineConfig(model=str(tiny("default")), device="cpu", moe_triton_max_tokens=9))
    assert rt.kernels == Kernels(kda="torch", mhc="torch", moe="torch", moe_triton_max_tokens=9)
    for field in ("mhc_backend", "moe_backend", "gemv_backend", "indexer_topk_backend"):
        with pytest.raises(ValueError, match=f"{field}: triton needs a CUDA device"):
            resolve_runtime(EngineConfig(model=str(tiny("default")), device="cpu", **{field: "triton"}))


def test_gemv_switch_reaches_every_linear_and_keeps_cpu_on_torch():
    import torch
    import torch.nn.functional as F

    from tpserve.kernels.choice import Kernels
    from tpserve.kernels.registry import resolve
    from tpserve.model.layers import Linear, ShardContext, column

    for gemv, quant in (("triton", "cuda"), ("torch", "triton")):
        ctx = ShardContext.single(torch.float32, kernels=Kernels(gemv=gemv, quant_gemv=quant))
        model = torch.nn.Sequential(column(ctx, 8, 4), torch.nn.Sequential(column(ctx, 4, 3)))
        for m in model.modules():
            if isinstance(m, Linear):
                m.weight.data.normal_()
                assert (m.ctx.ops.linear.gemv, m.ctx.ops.linear.quant_gemv) == (gemv, quant)
        x = torch.randn(2, 8)
        assert torch.equal(model[0](x), F.linear(x, model[0].weight))  # a CPU tensor never takes the GPU kernel
    with pytest.raises(ValueError, match="gemv_backend: expected triton or torch, got 'cutlass'"):
        resolve(Kernels(gemv="cutlass"))
    with pytest.raises(ValueError, match="quant_gemv_backend: expected cuda or triton, got 'torch'"):
        resolve(Kernels(quant_gemv="torch"))


def test_cli_reports_bad_settings_in_one_line(capsys):
    from tpserve.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["generate", "--device", "cpu", "--moe-backend", "triton", "--prompt", "hi"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "tpserve: error: moe_backend: triton needs a CUDA device" in err and "Traceback" not in err


def test_quant_decode_backend_resolves_and_refuses_float16():
    import torch

    from tpserve.engine.setup import quant_decode

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert quant_decode("auto", cuda, torch.bfloat16) == ("qtile-b", "qtile-b")
    assert quant_decode("qtile", cuda, torch.bfloat16) == ("qtile", "qtile")
    assert quant_decode("auto", cuda, torch.float16) == ("element", "element")
    assert quant_decode("auto", cpu, torch.float32) == ("element", "element")
    assert quant_decode("element", cuda, torch.bfloat16) == ("element", "element")
    with pytest.raises(ValueError, match="quant_decode_backend"):
        quant_decode("qtile", cuda, torch.float16)
    with pytest.raises(ValueError, match="quant_decode_backend"):
        EngineConfig.from_env({"TPSERVE_QUANT_DECODE_BACKEND": "lut"})


def test_quant_gemv_backend_resolves():
    import torch

    from tpserve.engine.setup import quant_gemv

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert quant_gemv("auto", cuda) == "cuda" and quant_gemv("auto", cpu) == "triton"
    assert quant_gemv("triton", cuda) == "triton" and quant_gemv("triton", cpu) == "triton"
    with pytest.raises(ValueError, match="quant_gemv_backend: cuda needs a CUDA device"):
        quant_gemv("cuda", cpu)
    with pytest.raises(ValueError, match="quant_gemv_backend"):
        EngineConfig.from_env({"TPSERVE_QUANT_GEMV_BACKEND": "cutlass"})
