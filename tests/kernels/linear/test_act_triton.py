"""The clamped SwiGLU kernel (kernels/linear/act_triton.py, Triton's CPU interpreter) against the torch form.

Bound: the SiLU in fp32 differs from torch's by an exp rounding (a few fp32 ulps), which the rounding to
the output dtype may turn into one ulp of that dtype; the product of the two 16-bit values is rounded
once on both sides, so the result may move one more ulp: 2 ulps of the output dtype, plus the fp32
part (float32 case)."""

from interpreted import run_interpreted


def test_swiglu_kernel_against_torch():
    out = run_interpreted("""
        import json, torch
        from tpserve.kernels.linear.ref import clamped_swiglu
        from tpserve.kernels.linear.act_triton import clamped_swiglu_triton
        res = {}
        for t, n, dtype, limit in [(3, 100, torch.float32, 1.5), (2, 3000, torch.float16, 10.0),
                                   (0, 8, torch.float16, 1.0), (5, 64, torch.float16, 0.5)]:
            g = torch.Generator().manual_seed(n)
            both = (4 * torch.randn(t, 2 * n + 6, generator=g)).to(dtype)
            gate, up = both[:, :n], both[:, n + 6:]           # strided rows, as slices of one projection
            got = clamped_swiglu_triton(gate, up, limit)
            want = clamped_swiglu(gate, up, limit)
            eps = torch.finfo(dtype).eps
            bound = 2 * eps * want.double().abs() + 2.0**-24 + 16 * torch.finfo(torch.float32).eps * want.double().abs()
            res[f"{t}x{n} {dtype}"] = [got.shape == want.shape and got.dtype == want.dtype,
                                       float(((got.double() - want.double()).abs() - bound).max()) if t else 0.0]
        try:
            clamped_swiglu_triton(torch.zeros(2, 4), torch.zeros(2, 5), 1.0)
            res["bad shapes"] = "no error"
        except ValueError as e:
            res["bad shapes"] = str(e)
        print(json.dumps(res))
    """)
    assert "must be equal 2-D shapes" in out.pop("bad shapes")
    for name, (same, excess) in out.items():
        assert same and excess <= 0, (name, excess)


def test_grouped_experts_take_the_kernel_under_act_triton():
    """The bf16 experts' grouped path (prefill) with act "triton" runs the clamped SwiGLU between its two
    grouped GEMMs through the kernel (counted), and agrees with act "torch" up to the kernel's bound
    carried through the down projection (bf16: well inside 2^-5 of the output's scale)."""
    out = run_interpreted("""
        import json, torch
        from tpserve.kernels.choice import Kernels
        from tpserve.kernels.linear import act_triton
        from tpserve.kernels.registry import resolve
        calls = []
        kernel = act_triton.clamped_swiglu_triton
        act_triton.clamped_swiglu_triton = lambda *a: calls.append(1) or kernel(*a)
        g = torch.Generator().manual_seed(0)
        e, d, i, t, k = 6, 32, 16, 9, 2
        x = torch.randn(t, d, generator=g).bfloat16()
        gu = (torch.randn(e, 2 * i, d, generator=g) / d**0.5).bfloat16()
        dn = (torch.randn(e, d, i, generator=g) / i**0.5).bfloat16()
        ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)])
        w = torch.rand(t, k, generator=g)
        res = {}
        for act in ("torch", "triton"):
            experts = resolve(Kernels(moe="triton", moe_triton_max_tokens=0, act=act)).experts
            assert experts.kernel("bf16", x) == "grouped_mm"
            res[act] = experts.bf16(x, w, ids, gu, dn, 7.0)
        diff = ((res["triton"].float() - res["torch"].float()).abs().max() / res["torch"].float().abs().max()).item()
        print(json.dumps({"calls": len(calls), "rel": diff}))
    """)
    assert out["calls"] == 1
    assert out["rel"] < 2.0**-5, out
