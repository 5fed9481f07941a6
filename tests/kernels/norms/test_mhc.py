"""mHC weights: the fused Triton kernel (run by Triton's CPU interpreter) equals the torch form."""

import torch
from interpreted import run_interpreted

from tpserve.kernels.norms.mhc import hc_weights_torch


def test_sinkhorn_makes_comb_doubly_stochastic():
    g = torch.Generator().manual_seed(0)
    n = 4
    mixed, base = torch.randn(5, (2 + n) * n, generator=g), torch.randn((2 + n) * n, generator=g)
    pre, post, comb = hc_weights_torch(mixed, base, torch.tensor([1.0, 1.0, 1.0]), n, 20, 1e-6)
    torch.testing.assert_close(comb.sum(-2), torch.ones(5, n), atol=1e-5, rtol=0)
    torch.testing.assert_close(comb.sum(-1), torch.ones(5, n), atol=1e-3, rtol=0)
    assert (pre > 0).all() and (post > 0).all() and (post < 2).all()


def test_triton_equals_torch():
    diffs = run_interpreted("""
        import json, torch
        from tpserve.kernels.norms.mhc import hc_weights_torch
        from tpserve.kernels.norms.mhc_triton import hc_weights_triton
        out = {}
        for t, n, iters in [(1, 4, 20), (37, 4, 20), (70, 3, 5), (9, 2, 1), (0, 4, 20)]:
            g = torch.Generator().manual_seed(t)
            mixed = 3 * torch.randn(t, (2 + n) * n, generator=g)
            base = torch.randn((2 + n) * n, generator=g)
            scale = torch.rand(3, generator=g) + 0.5
            want = hc_weights_torch(mixed, base, scale, n, iters, 1e-6)
            got = hc_weights_triton(mixed, base, scale, n, iters, 1e-6)
            for name, a, b in zip(("pre", "post", "comb"), got, want):
                ok = a.shape == b.shape and bool(torch.isfinite(a).all())
                diff = (a - b).abs().max().item() if a.numel() else 0.0
                out[f"{t},{n},{iters},{name}"] = diff if ok else 1e9
        print(json.dumps(out))
    """)
    assert len(diffs) == 15
    bad = {k: v for k, v in diffs.items() if v > 2e-6}
    assert not bad, bad
