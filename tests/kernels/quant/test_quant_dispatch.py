"""kernels/quant/dispatch.py: the one table that picks a linear's and the experts' kernel. On the CPU the machine
facts (Triton on a CUDA device, sm_90, the CUDA GEMV's build) are stood in for and every kernel entry point is
replaced by a recorder, so each case shows which entry point a call reaches and with what (the kernel each path
launched before this table: the expectations below), and that the table names it."""

import sys
from types import ModuleType

import pytest
import torch

import tpserve.kernels.linear
import tpserve.kernels.moe
import tpserve.kernels.quant
from tpserve.kernels.choice import Kernels
from tpserve.kernels.moe import ref as moe_ref
from tpserve.kernels.quant import dispatch, gemv_cuda, nvfp4_m1_cuda
from tpserve.kernels.quant import ref as qr
from tpserve.kernels.registry import resolve

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32

# (format, rows, dtype, K, block, triton, sm90, CUDA GEMV builds, --quant-gemv-backend, --pdl) -> entry point called
LINEAR_CASES = [
    (("fp8-block", 1, BF16, 512, (128, 128), True, False, True, "cuda", False), ("w8a16_gemv", "qtile=False")),
    (("fp8-block", 1, BF16, 512, (128, 128), True, False, True, "cuda", True), ("fp8_gemv", "pdl=True")),
    (("fp8-block", 4, BF16, 512, (128, 128), True, False, True, "cuda", False), ("fp8_gemv", "pdl=False")),
    (("fp8-block", 8, BF16, 512, (128, 128), True, False, True, "cuda", True), ("fp8_gemv", "pdl=True")),
    (("fp8-block", 4, BF16, 512, (128, 128), True, False, False, "cuda", False), ("w8a16_gemv", "qtile=True")),
    (("fp8-block", 4, BF16, 512, (128, 128), True, False, True, "triton", True), ("w8a16_gemv", "qtile=True")),
    (("fp8-block", 12, BF16, 512, (128, 128), True, False, True, "cuda", False), ("w8a16_gemv", "qtile=True")),
    (("fp8-block", 4, FP16, 512, (128, 128), True, False, True, "cuda", False), ("w8a16_gemv", "qtile=False")),
    (("fp8-block", 4, BF16, 512, (128, 64), True, False, True, "cuda", False), ("w8a16_gemm", "")),
    (("fp8-block", 4, BF16, 512, (32, 128), True, False, True, "cuda", False), ("fp8_gemv", "pdl=False")),
    (("fp8-block", 40, BF16, 512, (128, 128), True, True, True, "cuda", False), ("scaled_mm", "")),
    (("fp8-block", 40, BF16, 512, (128, 128), True, False, True, "cuda", False), ("dequant", "")),
    (("fp8-block", 4, BF16, 512, (128, 128), False, True, True, "cuda", False), ("scaled_mm", "")),
    (("fp8-block", 4, BF16, 512, (128, 128), False, False, True, "cuda", False), ("dequant", "")),
    (("fp8-channel", 1, BF16, 512, None, True, False, True, "cuda", True), ("w8a16_gemv", "qtile=False")),
    (("fp8-channel", 3, BF16, 384, None, True, False, True, "cuda", False), ("w8a16_gemv", "qtile=True")),
    (("fp8-channel", 3, BF16, 96, None, True, False, True, "cuda", False), ("w8a16_gemm", "")),
    (("fp8-channel", 40, BF16, 512, None, True, True, True, "cuda", False), ("dequant", "")),
    (("nvfp4", 1, BF16, 512, None, True, False, True, "cuda", True), ("m1_gemv", "")),
    (("nvfp4", 4, BF16, 512, None, True, False, True, "cuda", True), ("nvfp4_gemv", "pdl=True")),
    (("nvfp4", 1, BF16, 512, None, True, False, True, "triton", False), ("w4a16_gemv", "row=True")),
    (("nvfp4", 1, BF16, 512, None, True, False, False, "cuda", False), ("w4a16_gemv", "row=True")),
    (("nvfp4", 4, BF16, 512, None, True, False, True, "triton", False), ("w4a16_gemv", "planes=True")),
    (("nvfp4", 12, BF16, 512, None, True, False, True, "cuda", False), ("w4a16_gemv", "planes=True")),
    (("nvfp4", 4, FP16, 512, None, True, False, True, "cuda", False), ("w4a16_gemv", "planes=False row=False")),
    (("nvfp4", 4, BF16, 384, None, True, False, True, "cuda", False), ("w4a16_gemm", "")),
    (("nvfp4", 40, BF16, 512, None, True, False, True, "cuda", False), ("w4a16_gemm", "")),
    (("nvfp4", 1, BF16, 512, None, False, True, True, "cuda", False), ("dequant", "")),
]

# (format, tokens, dtype, --moe-backend, --moe-triton-max-tokens, --quant-gemv-backend, triton, CUDA kernels build,
#  --quant-decode-backend) -> entry point called
EXPERT_CASES = [
    (("bf16", 2, BF16, "triton", 8, "cuda", True, True, "qtile-b"), ("experts_triton", "route=triton")),
    (("bf16", 9, BF16, "triton", 8, "cuda", True, True, "qtile-b"), ("experts_grouped", "combine=triton")),
    (("bf16", 0, BF16, "triton", 8, "cuda", True, True, "qtile-b"), ("experts_grouped", "combine=triton")),
    (("bf16", 9, FP32, "triton", 8, "cuda", True, True, "qtile-b"), ("loop", "")),
    (("bf16", 2, BF16, "torch", 8, "cuda", True, True, "qtile-b"), ("loop", "")),
    (("fp8", 1, BF16, "triton", 0, "cuda", True, True, "qtile-b"), ("experts_fp8_triton", "qtile=True qtile_a=False")),
    (("fp8", 1, BF16, "triton", 0, "cuda", True, True, "element"), ("experts_fp8_triton", "qtile=False qtile_a=False")),
    (("fp8", 1, BF16, "triton", 0, "cuda", False, True, "qtile-b"), ("loop", "")),
    (("nvfp4", 8, BF16, "triton", 0, "cuda", True, True, "qtile-b"), ("m1_experts", "")),
    (("nvfp4", 0, BF16, "triton", 0, "cuda", True, True, "qtile-b"), ("m1_experts", "")),
    (("nvfp4", 9, BF16, "triton", 0, "cuda", True, True, "qtile"), ("experts_nvfp4_triton", "qtile=True qtile_a=True")),
    (("nvfp4", 1, BF16, "triton", 0, "cuda", True, False, "qtile-b"),
     ("experts_nvfp4_triton", "qtile=True qtile_a=False")),
    (("nvfp4", 1, FP16, "triton", 0, "cuda", True, True, "element"),
     ("experts_nvfp4_triton", "qtile=False qtile_a=False")),
    (("nvfp4", 1, BF16, "triton", 0, "triton", True, True, "qtile-b"),
     ("experts_nvfp4_triton", "qtile=True qtile_a=False")),
    (("nvfp4", 1, BF16, "torch", 0, "cuda", True, True, "qtile-b"), ("loop", "")),
]


def _flags(**kw) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(kw.items()))


@pytest.fixture
def recorded(monkeypatch):
    """Every kernel entry point the dispatch can reach replaced by a recorder; -> the calls list."""
    calls = []

    def recorder(name, *keep):
        def fn(*args, **kw):
            calls.append((name, _flags(**{k: v for k, v in kw.items() if k in keep})))
            return torch.zeros(args[0].shape[0], args[1].shape[0] if name not in EXPERTS else args[0].shape[1])
        return fn

    def fake(package, name, **fns):
        module = ModuleType(f"{package.__name__}.{name}")
        for k, v in fns.items():
            setattr(module, k, v)
        monkeypatch.setitem(sys.modules, module.__name__, module)
        monkeypatch.setattr(package, name, module, raising=False)

    fake(tpserve.kernels.quant, "gemv_triton", w8a16_gemv=recorder("w8a16_gemv", "qtile"))
    fake(tpserve.kernels.quant, "gemv_nvfp4_triton", w4a16_gemv=recorder("w4a16_gemv", "row", "planes"))
    fake(tpserve.kernels.quant, "gemm_triton", w8a16_gemm=recorder("w8a16_gemm"), w4a16_gemm=recorder("w4a16_gemm"),
         experts_fp8_triton=recorder("experts_fp8_triton", "qtile", "qtile_a"),
         experts_nvfp4_triton=recorder("experts_nvfp4_triton", "qtile", "qtile_a"))
    fake(tpserve.kernels.moe, "grouped_triton", experts_triton=recorder("experts_triton", "route_backend"))
    fake(tpserve.kernels.linear, "gemv_triton", gemv=recorder("gemv16"), fits=lambda x, w: True)
    monkeypatch.setattr(gemv_cuda, "fp8_gemv", recorder("fp8_gemv", "pdl"))
    monkeypatch.setattr(gemv_cuda, "nvfp4_gemv", recorder("nvfp4_gemv", "pdl"))
    monkeypatch.setattr(nvfp4_m1_cuda, "gemv", recorder("m1_gemv"))
    monkeypatch.setattr(nvfp4_m1_cuda, "experts", recorder("m1_experts"))
    monkeypatch.setattr(qr, "w8a8_block_scaled_mm", recorder("scaled_mm"))
    monkeypatch.setattr(moe_ref, "experts_grouped", recorder("experts_grouped", "combine"))
    monkeypatch.setattr(moe_ref, "experts_loop", recorder("loop"))
    monkeypatch.setattr(moe_ref, "experts_loop_fn", recorder("loop"))
    for name in ("fp8_block_dequantize", "fp8_channel_dequantize", "nvfp4_dequantize"):
        real = getattr(qr, name)
        monkeypatch.setattr(qr, name, lambda *a, _real=real, **kw: calls.append(("dequant", "")) or _real(*a, **kw))
    return calls


EXPERTS = ("m1_experts", "experts_triton", "experts_grouped", "loop", "experts_fp8_triton", "experts_nvfp4_triton")


def _machine(monkeypatch, triton: bool, sm90: bool, builds: bool):
    monkeypatch.setattr(dispatch, "on_triton", lambda x: triton)
    monkeypatch.setattr(dispatch, "sm90", lambda x: sm90)
    monkeypatch.setattr(gemv_cuda, "available", lambda x: builds)


def _renamed(calls):  # the recorders of the route / combine backends name them by their argument
    return [(n, f.replace("route_backend", "route")) for n, f in calls]


@pytest.mark.parametrize("case,want", LINEAR_CASES, ids=lambda c: " ".join(map(str, c)) if isinstance(c, tuple) else c)
def test_linear_reaches_the_kernel_it_reached_before(recorded, monkeypatch, case, want):
    fmt, m, dtype, k, block, triton, sm90, builds, quant_gemv, pdl = case
    _machine(monkeypatch, triton, sm90, builds)
    linear = resolve(Kernels(quant_gemv=quant_gemv, pdl=pdl)).linear
    g = torch.Generator().manual_seed(m)
    w, x = torch.randn(256, k, generator=g) / k**0.5, torch.randn(m, k, generator=g).to(dtype)
    if fmt == "fp8-block":
        q, s = qr.fp8_block_quantize(w, block)
        y = linear.fp8_block(x, q, s, block)
        name = linear.kernel(fmt, x, q, k, 256, block)
    elif fmt == "fp8-channel":
        q, s = qr.fp8_channel_quantize(w)
        y = linear.fp8_channel(x, q, s)
        name = linear.kernel(fmt, x, q, k, 256, (1, k))
    else:
        p, bs, s2 = qr.nvfp4_quantize(w)
        y = linear.nvfp4(x, p, bs, s2)
        name = linear.kernel(fmt, x, p, k, 256)
    assert recorded == [want], (case, name)
    assert y.shape == (m, 256)
    expect = {"w8a16_gemv": {"qtile=False": ("triton_fp8_row", "triton_fp8_gemv"), "qtile=True": ("triton_fp8_qtile",)},
              "w4a16_gemv": {"row=True": ("triton_nvfp4_row",), "planes=True": ("triton_nvfp4_planes",),
                             "planes=False row=False": ("triton_nvfp4_gemv",)}}
    names = expect[want[0]][want[1]] if want[0] in expect else {
        "fp8_gemv": ("cuda_fp8_gemv",), "nvfp4_gemv": ("cuda_nvfp4_gemv",), "m1_gemv": ("cuda_nvfp4_m1",),
        "w8a16_gemm": ("triton_gemm",), "w4a16_gemm": ("triton_gemm",), "scaled_mm": ("scaled_mm",),
        "dequant": ("dequant",)}[want[0]]
    assert name in names  # the table names the kernel the call reached


@pytest.mark.parametrize("case,want", EXPERT_CASES, ids=lambda c: " ".join(map(str, c)) if isinstance(c, tuple) else c)
def test_experts_reach_the_kernel_they_reached_before(recorded, monkeypatch, case, want):
    fmt, t, dtype, moe, max_tokens, quant_gemv, triton, builds, decode = case
    _machine(monkeypatch, triton, False, builds)
    monkeypatch.setattr(nvfp4_m1_cuda, "usable", lambda x, inter: x.dtype == BF16 and builds)
    ops = resolve(Kernels(moe=moe, moe_triton_max_tokens=max_tokens, quant_gemv=quant_gemv, moe_route="triton",
                          quant_decode=decode, quant_decode_fp8=decode))
    e, d, i = 4, 256, 256
    x, ids = torch.randn(t, d).to(dtype), torch.zeros(t, 2, dtype=torch.long)
    weights = torch.ones(t, 2)
    if fmt == "bf16":
        ops.experts.bf16(x, weights, ids, torch.zeros(e, 2 * i, d, dtype=dtype), torch.zeros(e, d, i, dtype=dtype),
                         7.0)
    elif fmt == "fp8":
        ops.experts.fp8(x, weights, ids, torch.zeros(e, 2 * i, d, dtype=torch.float8_e4m3fn), torch.ones(e, 4, 2),
                        torch.zeros(e, d, i, dtype=torch.float8_e4m3fn), torch.ones(e, 2, 2), (128, 128), 7.0)
    else:
        layer = type("Layer", (), dict(
            gate_up_proj=torch.zeros(e, 2 * i, d // 2, dtype=torch.uint8), gate_up_scale2=torch.ones(e, 2),
            gate_up_bscale=torch.ones(e, 2 * i, d // 16).to(torch.float8_e4m3fn), down_scale2=torch.ones(e, 1),
            down_proj=torch.zeros(e, d, i // 2, dtype=torch.uint8),
            down_bscale=torch.ones(e, d, i // 16).to(torch.float8_e4m3fn)))
        ops.experts.nvfp4(x, weights, ids, layer, 7.0)
    assert _renamed(recorded) == [want], case


def test_table_text_and_the_grouped_pieces():
    """The table prints a rule a line; the sequence-parallel fold takes grouped_mm's pieces exactly where `bf16`
    takes grouped_mm."""
    text = dispatch.describe(dispatch.LINEAR)
    assert len(text.splitlines()) == len(dispatch.LINEAR) and "cuda_nvfp4_m1" in text
    print(text)
    print(dispatch.describe(dispatch.EXPERTS))
    experts = resolve(Kernels(moe="triton", moe_triton_max_tokens=4)).experts
    g = torch.Generator().manual_seed(0)
    e, d, i, k = 4, 16, 8, 2
    gu, dn = torch.randn(e, 2 * i, d, generator=g).bfloat16(), torch.randn(e, d, i, generator=g).bfloat16()
    for t in (3, 6):
        x, ids = torch.randn(t, d, generator=g).bfloat16(), torch.randint(0, e, (t, k), generator=g)
        pieces = experts.sorted_bf16(x, torch.rand(t, k, generator=g), ids, gu, dn, 7.0)
        assert (pieces is not None) == (experts.kernel("bf16", x) == "grouped_mm") == (t > 4)
