"""The decode GEMV (kernels/linear/gemv_triton.py, Triton's CPU interpreter) against a float64 product.

Bound: every product x_k w_k of two 16-bit (or fp32) values is exact in fp32 for 16-bit inputs and
within an fp32 ulp for fp32; summing K of them in fp32 in any order errs by at most
K * eps32 * sum_k |x_k w_k| (the classic recursive-summation bound, per output); the final rounding to
the output dtype adds half an ulp of that dtype: 0.5 * eps_out * |y| (+ eps_out * 2^-14 for subnormals).
Every element is checked (NaN-filled output buffers would fail), rows 1..16, odd N and K, every
config the autotuner may pick. float16 and float32 only: the interpreter has no true bfloat16 (its dots
on bfloat16 return garbage); bench/gemv_kernels.py checks bfloat16 on the GPU against F.linear."""

from interpreted import run_interpreted


def test_gemv_against_float64():
    out = run_interpreted("""
        import json, torch, triton
        from tpserve.kernels.linear import gemv_triton as G
        res = {}
        cases = [(1, 2048, 512, torch.float16), (3, 2051, 300, torch.float16), (16, 2048, 256, torch.float16),
                 (1, 2100, 1000, torch.float32), (9, 2064, 96, torch.float32)]
        for m, n, k, dtype in cases:
            g = torch.Generator().manual_seed(m * n + k)
            x = torch.randn(m, k, generator=g).to(dtype)
            w = (torch.randn(n, k, generator=g) / k ** 0.5).to(dtype)
            want = x.double() @ w.double().T
            mag = x.double().abs() @ w.double().abs().T
            eps_out = torch.finfo(dtype).eps
            bound = k * torch.finfo(torch.float32).eps * mag + 0.5 * eps_out * want.abs() + eps_out * 2.0**-14
            worst = -1e30
            for cfg in G._gemv_kernel.configs:   # each config the autotuner could pick, not only its choice
                if cfg not in G._prune(G._gemv_kernel.configs, {"BLOCK_M": 1 if m == 1 else 16}):
                    continue
                y = torch.full((m, n), float("nan"), dtype=dtype)
                G._gemv_kernel.fn[(triton.cdiv(n, cfg.kwargs["BLOCK_N"]),)](
                    x, w, y, m, n, k, x.stride(0), w.stride(0), y.stride(0),
                    PRECISION="ieee" if dtype == torch.float32 else "tf32", BLOCK_M=1 if m == 1 else 16, PDL=False,
                    **cfg.kwargs)
                worst = max(worst, float(((y.double() - want).abs() - bound).max()))
            res[f"{m}x{n}x{k} {dtype}"] = worst
        x = torch.randn(1, 64)
        res["fits small N"] = G.fits(x, torch.randn(64, 64))
        try:
            G.gemv(torch.randn(17, 8), torch.randn(2048, 8))
            res["17 rows"] = "no error"
        except ValueError as e:
            res["17 rows"] = str(e)
        print(json.dumps(res))
    """)
    assert "must be [1..16, K]" in out.pop("17 rows")
    assert out.pop("fits small N") is False
    assert all(excess <= 0 for excess in out.values()), out
