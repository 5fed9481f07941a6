"""The indexer's pool compression kernel (kernels/indexer_triton.py, Triton's CPU interpreter) against the
torch form in model/indexer.py.

Bound: both round the probabilities and each product to the key dtype, so they differ only where the
softmax's exp, its sum or the final sum round differently: a few fp32 ulps that may move the rounded
probability or product by one ulp of the key dtype; the kpool-term sum then carries at most kpool such
ulps of the largest product, and the final rounding one more ulp of the result."""

from interpreted import run_interpreted


def test_fill_pools_kernel_against_torch():
    out = run_interpreted("""
        import json, torch
        from tpserve.kernels.indexer_triton import fill_pools
        res = {}
        for t, kpool, d, dtype in [(3, 16, 128, torch.float16), (5, 4, 24, torch.float32), (1, 3, 10, torch.float16)]:
            g = torch.Generator().manual_seed(t * d)
            keys = torch.randn(40, d, generator=g).to(dtype)
            gates = (3 * torch.randn(40, d, generator=g)).to(dtype)
            ape = torch.randn(kpool, d, generator=g).to(dtype)
            rows = torch.randint(0, 40, (t, kpool), generator=g)
            target = torch.randperm(6, generator=g)[:t]
            want = torch.zeros(7, d, dtype=dtype)
            probs = (gates[rows].float() + ape.float()).softmax(dim=1).to(dtype)
            want[target] = (probs * keys[rows]).sum(dim=1).to(dtype)
            got = torch.zeros(7, d, dtype=dtype)
            fill_pools(keys, gates, ape, rows, target, got)
            eps = torch.finfo(dtype).eps
            top = (probs.double() * keys[rows].double()).abs().amax(1)            # [t, d]
            bound = torch.zeros(7, d, dtype=torch.float64)
            bound[target] = (kpool + 1) * eps * top + 2.0**-24
            res[f"{t}x{kpool}x{d} {dtype}"] = [
                float(((got.double() - want.double()).abs() - bound).max()),
                bool((got[[i for i in range(7) if i not in target.tolist()]] == 0).all())]
        print(json.dumps(res))
    """)
    for name, (excess, untouched) in out.items():
        assert excess <= 0 and untouched, (name, excess, untouched)
