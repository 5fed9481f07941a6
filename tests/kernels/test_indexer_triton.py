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


def test_decode_scores_kernel_against_reference():
    """Decode index scores read from the paged pool cache in place, against a float64 reference of
    sum_h w_h relu(q_h . key_p / sqrt(d)). Bound: each head's dot product is d fp32 terms (<= d u32 sum |q k|
    / sqrt(d)), relu passes errors on unchanged, the head sum adds H u32 sum |w s| on top of sum |w_h| err_h.
    Pools not complete at a token's position score float32's lowest value exactly."""
    out = run_interpreted("""
        import json, torch
        from tpserve.kernels.indexer_triton import decode_scores
        res = {}
        for n, heads, d, kpool, bs, dtype in [(3, 4, 32, 8, 16, torch.float32), (2, 32, 128, 16, 64, torch.float16),
                                              (4, 5, 24, 4, 8, torch.float32)]:
            g = torch.Generator().manual_seed(n * d + heads)
            nb, blocks = 6, 20
            pool = torch.randn(blocks * bs // kpool, d, generator=g).to(dtype)
            tables = torch.stack([torch.randperm(blocks, generator=g)[:nb] for _ in range(n + 1)])
            seq = torch.tensor([(i * 2) % (n + 1) for i in range(n)])
            pos = torch.randint(0, nb * bs, (n,), generator=g)
            pos[0] = kpool - 2                                       # no complete pool yet
            q = torch.randn(n, heads, d, generator=g).to(dtype)
            w = torch.randn(n, heads, generator=g)
            n_pools = nb * bs // kpool
            got = decode_scores(q, w, pos, seq, tables, pool, bs, kpool, n_pools)
            j = torch.arange(n_pools)
            visible = (j + 1) * kpool <= pos[:, None] + 1
            start = j * kpool
            rows = (tables[seq[:, None], start // bs] * bs + start % bs) // kpool   # [n, P]
            keys = pool[rows].double()                                              # [n, P, d]
            s = torch.einsum("nhd,npd->nhp", q.double(), keys) * d ** -0.5
            ref = torch.einsum("nh,nhp->np", w.double(), s.clamp(min=0))
            u32 = 2.0 ** -24
            dots = torch.einsum("nhd,npd->nhp", q.double().abs(), keys.abs()) * d ** -0.5
            bound = torch.einsum("nh,nhp->np", w.double().abs(), d * u32 * dots + heads * u32 * s.abs()) + 1e-30
            lowest = torch.finfo(torch.float32).min
            res[f"{n}x{heads}x{d} kpool {kpool} {dtype}"] = [
                float(((got.double() - ref).abs() - bound)[visible].max()),
                bool((got[~visible] == lowest).all()), bool((~visible[0]).all())]
        print(json.dumps(res))
    """)
    for name, (excess, masked, first_empty) in out.items():
        assert excess <= 0 and masked and first_empty, (name, excess, masked, first_empty)
