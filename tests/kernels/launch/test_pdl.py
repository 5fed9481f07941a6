"""Programmatic dependent launch between our Triton kernels (kernels/launch/pdl_triton.py, switch --pdl).

CPU: the switch's resolution and the ops it reaches; the PTX order of each kernel compiled for sm_90 with PDL on
(signal, then the GEMV's weight loads, then the wait, before any other load or store) where Triton can assemble
(the interpreter suite's child). GPU (sm_90+): every kernel with PDL gives its plain launch's output bit for bit,
launched eagerly and as a chain captured in a CUDA graph; a model's greedy tokens with --pdl on and off."""

import dataclasses

import pytest
import torch

from tpserve.engine.setup import pdl as resolve_pdl

SM90 = torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0)


def test_pdl_switch_resolves_off_on_cpu_and_refuses_on():
    assert resolve_pdl("auto", torch.device("cpu")) is False
    assert resolve_pdl("off", torch.device("cpu")) is False
    with pytest.raises(ValueError, match="pdl: on needs a CUDA device of compute capability 9.0"):
        resolve_pdl("on", torch.device("cpu"))
    with pytest.raises(ValueError, match="pdl: expected auto, on or off"):
        resolve_pdl("yes", torch.device("cpu"))


def test_pdl_is_part_of_the_resolved_ops_every_module_runs():
    """--pdl resolves into the ops (kernels/registry.py): the ops whose kernels launch as programmatic dependents
    carry it where their backend is a fast one, and every module of a model runs those resolved ops."""
    from tpserve.kernels.choice import Kernels
    from tpserve.kernels.registry import Bound, registered, resolve
    from tpserve.model.config import ModelConfig
    from tpserve.model.glm5_next import Glm5NextModel
    from tpserve.model.layers import GatedRMSNorm, Linear, RMSNorm, ShardContext
    from tpserve.model.mhc import HyperConnection
    from tpserve.model.mlp import DenseMLP
    from tpserve.model.moe import Router
    from tpserve.model.tiny import tiny_config_dict

    fast = Kernels(norm="triton", mhc="triton", act="triton", kda_prep="triton", moe_route="triton", gemv="triton",
                   quant_gemv="cuda")
    with_pdl = {name for name, (_, _, _, pdl) in registered().items() if pdl}
    assert with_pdl == {"rms_norm", "gated_rms_norm", "hc_stream_norm", "hc_collapse", "hc_expand", "hc_weights",
                        "swiglu", "route", "kda_conv_rows", "kda_gate_beta"}
    on, off = resolve(dataclasses.replace(fast, pdl=True)), resolve(fast)
    assert all(getattr(on, name).pdl and not getattr(off, name).pdl for name in with_pdl)
    assert on.linear.pdl and not off.linear.pdl
    assert not any(op.pdl for op in vars(resolve(Kernels(pdl=True))).values() if isinstance(op, Bound))  # torch
    with torch.device("meta"):
        model = Glm5NextModel(ShardContext.single(torch.float32, "meta", dataclasses.replace(fast, pdl=True)),
                              ModelConfig.from_dict(tiny_config_dict()))
    mods = [m for m in model.modules() if isinstance(m, (Linear, RMSNorm, GatedRMSNorm, HyperConnection, DenseMLP,
                                                          Router))]
    assert {type(m) for m in mods} >= {Linear, RMSNorm, HyperConnection, Router, DenseMLP}
    held = [m.ctx.ops.linear if isinstance(m, Linear) else m.ops.hc_expand if isinstance(m, HyperConnection)
            else m.swiglu if isinstance(m, DenseMLP) else m.route if isinstance(m, Router) else m.op for m in mods]
    assert all(op.pdl for op in held)


def _ptx_cases():
    from tpserve.kernels.linear import act_triton
    from tpserve.kernels.linear import gemv_triton
    from tpserve.kernels.attention import kda_prep_triton
    from tpserve.kernels.norms import mhc_triton
    from tpserve.kernels.norms import norm_triton
    from tpserve.kernels.moe import route_triton

    bf16, f32 = "*bf16", "*fp32"
    return {
        "gemv 1 row": (gemv_triton._gemv_kernel.fn,
                       dict(x_ptr=bf16, w_ptr=bf16, y_ptr=bf16, M="i32", N="i32", K="i32", stride_xm="i32",
                            stride_wn="i32", stride_ym="i32"),
                       dict(PRECISION="tf32", BLOCK_M=1, BLOCK_N=16, BLOCK_K=512), True),
        "gemv 16 rows": (gemv_triton._gemv_kernel.fn,
                         dict(x_ptr=bf16, w_ptr=bf16, y_ptr=bf16, M="i32", N="i32", K="i32", stride_xm="i32",
                              stride_wn="i32", stride_ym="i32"),
                         dict(PRECISION="tf32", BLOCK_M=16, BLOCK_N=16, BLOCK_K=256), False),
        "rms_norm": (norm_triton._rms_norm_kernel,
                     dict(x_ptr=bf16, w_ptr=bf16, g_ptr=bf16, out_ptr=bf16, D="i32", x_stride="i32", g_stride="i32",
                          out_stride="i32", eps="fp32"),
                     dict(MODE=0, DT="tl.bfloat16", OUT_DT="tl.bfloat16", BLOCK=1024), False),
        "hc_collapse": (norm_triton._hc_collapse_kernel,
                        dict(pre_ptr=f32, s_ptr=bf16, out_ptr=bf16, D="i32", s_stride_t="i32", s_stride_n="i32"),
                        dict(N=4, BLOCK=1024), False),
        "hc_expand": (norm_triton._hc_expand_kernel,
                      dict(x_ptr=bf16, s_ptr=bf16, post_ptr=f32, comb_ptr=f32, out_ptr=bf16, D="i32",
                           x_stride="i32", s_stride_t="i32", s_stride_n="i32"),
                      dict(N=4, DT="tl.bfloat16", BLOCK=1024), False),
        "hc_weights": (mhc_triton._hc_weights_kernel,
                       dict(mixed_ptr=f32, base_ptr=f32, scale_ptr=f32, pre_ptr=f32, post_ptr=f32, comb_ptr=f32,
                            T="i32", eps="fp32"),
                       dict(N=4, NP=4, ITERS=20, BLOCK_T=32), False),
        "conv_rows": (kda_prep_triton._conv_rows_kernel,
                      dict(x_ptr=bf16, stride_x="i32", pool_ptr=bf16, slots_ptr="*i64", w_ptr=f32, out_ptr=bf16,
                           stride_part="i32", stride_row="i32", C="i32", PART="i32"),
                      dict(N=1, KW=4, UPDATE=True, BLOCK_C=1024), False),
        "gate_beta": (kda_prep_triton._gate_beta_kernel,
                      dict(f_ptr=bf16, stride_f="i32", dt_ptr=f32, alog_ptr=f32, b_ptr=bf16, stride_b="i32",
                           g_ptr=f32, beta_ptr=bf16, C="i32", H="i32", lower="fp32"),
                      dict(K=128, BLOCK_C=2048, BLOCK_H=32), False),
        "router": (route_triton._router_kernel,
                   dict(logits_ptr=f32, bias_ptr=f32, w_ptr=f32, ids_ptr="*i64", E="i32", scaling="fp32"),
                   dict(TOP_K=8, NORM=True, E_PAD=512, K_PAD=8), False),
        "swiglu": (act_triton._swiglu_kernel,
                   dict(g_ptr=bf16, stride_g="i32", u_ptr=bf16, stride_u="i32", out_ptr=bf16, N="i32", limit="fp32"),
                   dict(BLOCK=2048), False),
    }


@pytest.mark.parametrize("name", ["gemv 1 row", "gemv 16 rows", "rms_norm", "hc_collapse", "hc_expand",
                                  "hc_weights", "swiglu", "conv_rows", "gate_beta", "router"])
def test_pdl_ptx_signals_then_waits_before_reading_inputs(name, tmp_path, monkeypatch):
    """With PDL the kernel signals first; nothing but weight loads (the one-row GEMV's first tile) comes before its
    wait; without PDL there is no griddepcontrol at all. (A cache of its own: a cache that kept binaries only, as
    bench/gpu_env.sh's does, would give back kernels without their PTX.)"""
    triton = pytest.importorskip("triton")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    import triton.language as tl

    fn, sig, constexprs, prefetch = _ptx_cases()[name]
    constexprs = {k: getattr(tl, v[3:]) if isinstance(v, str) and v.startswith("tl.") else v
                  for k, v in constexprs.items()}
    signature = {**sig, **{k: "constexpr" for k in constexprs}, "PDL": "constexpr"}
    ptx = {}
    for on in (False, True):
        try:
            kernel = triton.compile(ASTSource(fn=fn, signature=signature, constexprs={**constexprs, "PDL": on}),
                                    target=GPUTarget("cuda", 90, 32), options={"launch_pdl": on})
        except RuntimeError as exc:  # (as tests/kernels/launch/test_compile_sm90.py)
            if "ptxas" in str(exc).lower() or "compatible backends" in str(exc):
                pytest.skip(f"Triton cannot assemble for sm_90 here: {exc}")
            raise
        ptx[on] = kernel.asm["ptx"].splitlines()
        assert kernel.metadata.launch_pdl is on
    assert not any("griddepcontrol" in line for line in ptx[False])
    lines = ptx[True]
    signal = [i for i, line in enumerate(lines) if "griddepcontrol.launch_dependents" in line]
    wait = [i for i, line in enumerate(lines) if "griddepcontrol.wait" in line]
    assert len(signal) == 1 and len(wait) == 1 and signal[0] < wait[0], (signal, wait)
    memory = [i for i, line in enumerate(lines) if line.strip().lstrip("@%p0123456789 ").startswith(("ld.", "st."))]
    before = [i for i in memory if i < wait[0] and ".param" not in lines[i]]
    if prefetch:  # the GEMV's first W tile: loads only, 16 bytes each
        assert before and all(".global" in lines[i] and "ld." in lines[i] for i in before), before
    else:
        assert not before, [lines[i] for i in before]


def _kernel_calls(dev):
    from tpserve.kernels.linear import act_triton
    from tpserve.kernels.linear import gemv_triton
    from tpserve.kernels.attention import kda_prep_triton
    from tpserve.kernels.norms import mhc_triton
    from tpserve.kernels.norms import norm_triton
    from tpserve.kernels.moe import route_triton

    g = torch.Generator(device=dev).manual_seed(0)
    bf = dict(device=dev, dtype=torch.bfloat16)
    x1, x8 = torch.randn(1, 4096, generator=g, **bf), torch.randn(8, 4096, generator=g, **bf)
    w = torch.randn(4096, 4096, generator=g, **bf) / 64
    nw = torch.rand(4096, generator=g, **bf)
    gate = torch.randn(8, 4096, generator=g, **bf)
    streams = torch.randn(8, 4, 4096, generator=g, **bf)
    pre = torch.rand(8, 4, generator=g, device=dev)
    post, comb = torch.rand(8, 4, generator=g, device=dev), torch.rand(8, 4, 4, generator=g, device=dev)
    mixed = torch.randn(8, 24, generator=g, device=dev)
    base, scale = torch.randn(24, generator=g, device=dev), torch.rand(3, generator=g, device=dev)
    qkv, pool = torch.randn(8, 3 * 512, generator=g, **bf), torch.randn(16, 3 * 512, 3, generator=g, **bf)
    slots, cw = torch.tensor([3, 0, 7, 1, 9, 15, 2, 4], device=dev), torch.randn(3 * 512, 4, generator=g, device=dev)
    f, dt, alog = torch.randn(8, 4096, generator=g, **bf), torch.randn(4096, generator=g, device=dev), \
        torch.randn(32, generator=g, device=dev)
    bb = torch.randn(8, 32, generator=g, **bf)
    logits, ebias = torch.randn(8, 288, generator=g, device=dev), torch.randn(288, generator=g, device=dev)
    return {
        "gemv 1 row": lambda p: gemv_triton.gemv(x1, w, pdl=p),
        "gemv 8 rows": lambda p: gemv_triton.gemv(x8, w, pdl=p),
        "rms_norm": lambda p: norm_triton.rms_norm(x8, nw, 1e-6, pdl=p),
        "rms_normalize": lambda p: norm_triton.rms_normalize(streams.view(8, -1), 1e-6, pdl=p),
        "gated_rms_norm": lambda p: norm_triton.gated_rms_norm(x8, gate, nw, 1e-6, pdl=p),
        "hc_collapse": lambda p: norm_triton.hc_collapse(pre, streams, pdl=p),
        "hc_expand": lambda p: norm_triton.hc_expand(x8, streams, post, comb, pdl=p),
        "hc_weights": lambda p: torch.cat([t.reshape(8, -1) for t in
                                           mhc_triton.hc_weights_triton(mixed, base, scale, 4, 20, 1e-6, pdl=p)], 1),
        "swiglu": lambda p: act_triton.clamped_swiglu_triton(x8, gate, 7.0, pdl=p),
        "conv_rows": lambda p: torch.cat(kda_prep_triton.conv_rows(qkv, pool.clone(), slots, cw, 1, True, pdl=p), 1),
        "conv_rows state": lambda p: _conv_state(kda_prep_triton.conv_rows, qkv, pool, slots, cw, p),
        "gate_beta": lambda p: torch.cat([t.reshape(8, -1).float() for t in
                                          kda_prep_triton.gate_beta(f, dt, alog, bb, 128, -5.0, pdl=p)], 1),
        "router": lambda p: torch.cat([t.reshape(8, -1).float() for t in
                                       route_triton.route_topk(logits, ebias, 8, True, 2.5, pdl=p)], 1),
    }


def _conv_state(conv_rows, qkv, pool, slots, cw, p):
    state = pool.clone()
    conv_rows(qkv, state, slots, cw, 1, True, pdl=p)
    return state


@pytest.mark.skipif(not SM90, reason="programmatic dependent launch needs an sm_90+ GPU")
def test_gpu_pdl_kernels_equal_plain_eager_and_in_a_graph():
    calls = _kernel_calls(torch.device("cuda"))
    plain = {name: f(False) for name, f in calls.items()}
    for name, f in calls.items():
        assert torch.equal(f(True), plain[name]), name
    # a chain in a CUDA graph: each kernel a programmatic dependent of the one before, each reading the last output
    from tpserve.kernels.linear import gemv_triton
    from tpserve.kernels.norms import norm_triton

    w = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16) / 64
    nw = torch.rand(4096, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)

    def chain(p):
        y = x
        for _ in range(6):
            y = norm_triton.rms_norm(gemv_triton.gemv(y, w, pdl=p), nw, 1e-6, pdl=p)
        return y

    want = chain(False)
    chain(True)
    torch.cuda.synchronize()
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    with torch.cuda.stream(stream), torch.cuda.graph(graph):
        out = chain(True)
    for _ in range(3):
        out.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, want)


@pytest.mark.skipif(not SM90, reason="programmatic dependent launch needs an sm_90+ GPU")
def test_gpu_greedy_tokens_equal_with_pdl_on_and_off():
    from tpserve import LLM, SamplingParams

    prompts = ["The capital of France is", "def fib(n):", "1, 2, 3, 5, 8,"]
    sp = SamplingParams(temperature=0.0, max_tokens=24, logprobs=2)
    assert resolve_pdl("auto", torch.device("cuda")) is True
    outs = {}
    for mode in ("off", "on"):
        llm = LLM(device="cuda", pdl=mode, kv_cache_memory=2**28)
        res = llm.generate(prompts, sp)
        outs[mode] = [(o.outputs[0].token_ids, [sorted(d.items()) for d in o.outputs[0].logprobs]) for o in res]
        del llm
        torch.cuda.empty_cache()
    assert outs["on"] == outs["off"]
