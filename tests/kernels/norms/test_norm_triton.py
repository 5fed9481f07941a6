"""Fused norm / mHC kernels (kernels/norms/norm_triton.py, run by Triton's CPU interpreter) against the torch
forms the model uses, within bounds derived from the arithmetic (collectives/fused.py); and the switch that
puts a whole model on them.

16-bit cases run in float16: the interpreter rounds float32 -> bfloat16 by truncation (numpy has no
bfloat16; GPUs round to nearest even), so a bf16 comparison here would test the interpreter. bf16 is
checked on the GPU (bench/gpu_check_tiny.py: greedy tokens with norm_backend triton vs torch)."""

import pytest
import torch
from interpreted import run_interpreted

from tpserve.kernels.choice import Kernels
from tpserve.model.glm5_next import Glm5NextModel
from tpserve.model.layers import GatedRMSNorm, RMSNorm, ShardContext
from tpserve.model.mhc import HyperConnection
from tpserve.model.config import ModelConfig
from tpserve.model.tiny import tiny_config_dict


def test_triton_norms_equal_torch_within_bounds():
    out = run_interpreted("""
        import json, torch
        from tpserve.collectives.fused import hc_expand, hc_expand_bound, rmsnorm_bound, _ulp
        from tpserve.kernels.norms import norm_triton as nt
        eps32 = torch.finfo(torch.float32).eps
        out = {}

        def excess(got, want, bound):
            # > 0 where |got - want| passes its bound; shapes and dtypes must match
            if got.shape != want.shape or got.dtype != want.dtype:
                return 1e9
            if got.numel() == 0:
                return 0.0
            return float(((got.double() - want.double()).abs() - bound.double()).max())

        for t, d, dtype in [(3, 64, torch.float32), (5, 300, torch.float16), (2, 5000, torch.float16),
                            (0, 64, torch.float16), (4, 4097, torch.float32)]:
            g = torch.Generator().manual_seed(d + t)
            base = 4 * torch.randn(t, d + 7, generator=g)
            x = base[:, 3:3 + d].to(dtype)               # a strided view: rows are not contiguous
            w = (1 + torch.randn(d, generator=g)).to(dtype)
            h = x.float()
            q = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5)
            want = w * q.to(dtype)
            out[f"rms {t},{d},{dtype}"] = excess(nt.rms_norm(x, w, 1e-5), want, rmsnorm_bound(x, w, 1e-5, want))
            qb = q.abs() * (d + 4) * eps32 + torch.finfo(torch.float32).tiny
            out[f"normalize {t},{d},{dtype}"] = excess(nt.rms_normalize(x, 1e-5), q, qb)
            gate = (2 * torch.randn(t, d, generator=g)).to(dtype)
            sig = torch.sigmoid(gate.float())
            gwant = (w.float() * q * sig).to(dtype)
            gb = (w.float().abs() * q.abs() * sig) * (d + 12) * eps32 + _ulp(gwant.float().abs(), dtype) * 1.01
            out[f"gated {t},{d},{dtype}"] = excess(nt.gated_rms_norm(x, gate, w, 1e-5), gwant, gb)

        for t, n, d, dtype in [(1, 4, 64, torch.float16), (6, 4, 1500, torch.float16), (3, 3, 40, torch.float32),
                               (0, 4, 64, torch.float16)]:
            g = torch.Generator().manual_seed(7 * d + t)
            streams = (3 * torch.randn(t, n, d, generator=g)).to(dtype)
            pre = torch.rand(t, n, generator=g) + 1e-6
            want = (pre.unsqueeze(-1) * streams).sum(dim=1).to(dtype)
            terms = (pre.unsqueeze(-1) * streams.float()).abs().sum(dim=1)
            bound = terms * n * eps32 + _ulp(want.float().abs(), dtype) * 1.01
            out[f"collapse {t},{n},{d},{dtype}"] = excess(nt.hc_collapse(pre, streams), want, bound)
            total = (2 * torch.randn(t, d, generator=g)).to(dtype)
            post = 2 * torch.rand(t, n, generator=g)
            comb = torch.softmax(torch.randn(t, n, n, generator=g), -1)
            want = hc_expand(total, streams, post, comb)
            out[f"expand {t},{n},{d},{dtype}"] = excess(nt.hc_expand(total, streams, post, comb), want,
                                                        hc_expand_bound(total, streams, post, comb))
        print(json.dumps(out))
    """)
    assert len(out) == 5 * 3 + 4 * 2
    bad = {k: v for k, v in out.items() if v > 0}
    assert not bad, bad


def test_gated_norm_rejects_a_gate_of_another_shape():
    pytest.importorskip("triton")
    from tpserve.kernels.norms.norm_triton import gated_rms_norm

    with pytest.raises(ValueError, match="gate shape"):
        gated_rms_norm(torch.zeros(2, 8), torch.zeros(2, 4), torch.ones(8), 1e-5)


def test_norm_backend_reaches_every_norm_and_hyper_connection():
    from tpserve.kernels.registry import resolve

    cfg = ModelConfig.from_dict(tiny_config_dict())

    def backends(kernels):
        with torch.device("meta"):
            model = Glm5NextModel(ShardContext.single(torch.float32, "meta", kernels), cfg)
        mods = [m for m in model.modules() if isinstance(m, (RMSNorm, GatedRMSNorm, HyperConnection))]
        assert any(isinstance(m, GatedRMSNorm) for m in mods) and any(isinstance(m, HyperConnection) for m in mods)
        return {(m.ops.hc_stream_norm.backend, m.ops.hc_collapse.backend, m.ops.hc_expand.backend)
                if isinstance(m, HyperConnection) else m.op.backend for m in mods}

    assert backends(Kernels()) == {"torch", ("torch",) * 3}
    assert backends(Kernels(norm="triton")) == {"triton", ("triton",) * 3}
    with pytest.raises(ValueError, match="norm_backend: 'cuda' is not a backend of op rms_norm"):
        resolve(Kernels(norm="cuda"))


def test_norm_backend_triton_needs_cuda():
    from tpserve.engine.setup import _triton_or_torch

    assert _triton_or_torch("norm_backend", "auto", torch.device("cpu")) == "torch"
    with pytest.raises(ValueError, match="norm_backend: triton needs a CUDA device"):
        _triton_or_torch("norm_backend", "triton", torch.device("cpu"))
