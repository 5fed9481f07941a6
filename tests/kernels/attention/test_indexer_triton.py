"""The indexer's pool compression kernel (kernels/attention/indexer_triton.py, Triton's CPU interpreter) against the
torch form in model/indexer.py.

Bound: both round the probabilities and each product to the key dtype, so they differ only where the
softmax's exp, its sum or the final sum round differently: a few fp32 ulps that may move the rounded
probability or product by one ulp of the key dtype; the kpool-term sum then carries at most kpool such
ulps of the largest product, and the final rounding one more ulp of the result."""

from interpreted import run_interpreted


def test_fill_pools_kernel_against_torch():
    """Tokens that complete a pool write its pooled key where model/indexer.py's torch form writes it (within
    the bound above); every other pool row is left as it was (the torch form sends those tokens' writes to
    the dummy row, the kernel skips them)."""
    out = run_interpreted("""
        import json, types, torch
        from tpserve.kernels.attention.indexer_triton import fill_pools
        from tpserve.model.indexer import Indexer
        res = {}
        for t, kpool, d, bs, dtype in [(9, 16, 128, 32, torch.float16), (12, 4, 24, 8, torch.float32),
                                       (7, 3, 10, 6, torch.float16)]:
            g = torch.Generator().manual_seed(t * d)
            blocks, nb = 10, 4
            keys = torch.randn(blocks * bs, d, generator=g).to(dtype)
            gates = (3 * torch.randn(blocks * bs, d, generator=g)).to(dtype)
            ape = torch.randn(kpool, d, generator=g).to(dtype)
            tables = torch.stack([torch.randperm(blocks - 1, generator=g)[:nb] for _ in range(3)])
            seq = torch.randint(0, 3, (t,), generator=g)
            pos = torch.randint(0, nb * bs, (t,), generator=g)
            pos[:3] = torch.tensor([kpool - 1, 2 * kpool - 1, kpool - 2])       # two complete a pool, one not
            pool_rows = blocks * bs // kpool
            dummy = pool_rows - 1
            ns = types.SimpleNamespace(kpool=kpool)
            batch = types.SimpleNamespace(positions=pos, block_tables=tables, token_seq=seq)
            rows, target = Indexer._fill_rows(ns, batch, bs, dummy)
            probs = (gates[rows].float() + ape.float()).softmax(dim=1).to(dtype)
            want = torch.zeros(pool_rows, d, dtype=dtype)
            want[target] = (probs * keys[rows]).sum(dim=1).to(dtype)
            got = torch.zeros(pool_rows, d, dtype=dtype)
            fill_pools(keys, gates, ape, pos, seq, tables, bs, got)
            written = sorted(set(target.tolist()) - {dummy})
            others = [r for r in range(pool_rows) if r not in written]
            eps = torch.finfo(dtype).eps
            top = torch.zeros(pool_rows, d, dtype=torch.float64)
            top[target] = (probs.double() * keys[rows].double()).abs().amax(1)
            bound = (kpool + 1) * eps * top + 2.0**-24
            res[f"{t} tokens kpool {kpool} d {d} {dtype}"] = [
                float(((got.double() - want.double()).abs() - bound)[written].max()),
                bool((got[others] == 0).all()), len(written)]
        print(json.dumps(res))
    """)
    for name, (excess, untouched, written) in out.items():
        assert excess <= 0 and untouched and written >= 2, (name, excess, untouched, written)


def test_decode_scores_kernel_against_reference():
    """Decode index scores read from the paged pool cache in place, against a float64 reference of
    sum_h w_h relu(q_h . key_p / sqrt(d)). Bound: each head's dot product is d fp32 terms (<= d u32 sum |q k|
    / sqrt(d)), relu passes errors on unchanged, the head sum adds H u32 sum |w s| on top of sum |w_h| err_h.
    Pools not complete at a token's position score float32's lowest value exactly."""
    out = run_interpreted("""
        import json, torch
        from tpserve.kernels.attention.indexer_triton import decode_scores
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


def test_expand_selection_kernel_equals_torch_form():
    """Chosen pools -> token positions (invalid pools -1) plus the unfinished pool's tail: integer work, so
    the kernel must equal model/indexer.py's torch form exactly (tail on and off, fewer pools than kept)."""
    out = run_interpreted("""
        import json, types, torch
        from tpserve.kernels.attention.indexer_triton import expand_selection
        from tpserve.model.indexer import Indexer
        res = {}
        for n, n_pools, keep, kpool, tail in [(5, 40, 8, 4, True), (3, 6, 8, 8, True), (4, 30, 5, 16, False),
                                             (2, 50, 4, 1, True)]:
            g = torch.Generator().manual_seed(n * n_pools + kpool)
            width = keep * kpool + (kpool - 1 if tail else 0)
            ns = types.SimpleNamespace(pools_to_keep=keep, kpool=kpool, width=width, tail=tail)
            ns._tail = lambda pos, ns=ns: Indexer._tail(ns, pos)
            pos = torch.randint(0, n_pools * kpool + 5, (n,), generator=g)
            pos[0] = 0
            scores = torch.randn(n, n_pools, generator=g)
            visible = (torch.arange(n_pools) + 1) * kpool <= pos[:, None] + 1
            scores = scores.masked_fill(~visible, torch.finfo(torch.float32).min)
            want = Indexer._expand(ns, scores, visible, pos)  # the torch form
            k = min(keep, n_pools)
            got = expand_selection(scores.topk(k, dim=-1).indices, pos, width, keep, kpool, tail)
            res[f"{n}x{n_pools} keep {keep} kpool {kpool} tail {tail}"] = [bool(torch.equal(got, want)),
                                                                           int((want >= 0).sum())]
        print(json.dumps(res))
    """)
    for name, (equal, selected) in out.items():
        assert equal and selected > 0, (name, equal, selected)


def test_top_pools_kernel_equals_a_stable_sort_of_the_complete_pools():
    """top_pools against torch.sort(stable, descending) of each token's complete pools: the same pools in the
    same order, equal scores included (lower index first), P past the complete ones; one round (P <= C) and
    several (C - k new pools per round), k from 1 to 128, rows with no complete pool; the single kernel and
    the chunked pair (parallel chunk sorts, one merge) alike."""
    out = run_interpreted("""
        import json, torch
        from tpserve.kernels.attention.indexer_triton import top_pools
        res = {}
        g = torch.Generator().manual_seed(3)
        for n, p, k, kpool in [(3, 300, 8, 4), (2, 2048, 128, 16), (4, 2500, 16, 16), (2, 64, 1, 1)]:
            s = torch.randn(n, p, generator=g)
            s[:, ::7] = 0.25                              # ties
            s[:, 5:9] = torch.finfo(torch.float32).min    # as low as the masked pools of decode_scores
            pos = torch.randint(0, p * kpool, (n,), generator=g)
            pos[0] = 2                                    # no complete pool (kpool > 3) or three
            pos[-1] = p * kpool - 1                       # all complete
            for chunked in (False, True, None):
                got = top_pools(s, pos, k, kpool, chunked=chunked)
                bad = 0
                for r in range(n):
                    v = min((int(pos[r]) + 1) // kpool, p)
                    want = torch.sort(s[r, :v], descending=True, stable=True).indices[:k]
                    m = min(v, k)
                    bad += int(not torch.equal(got[r, :m], want[:m]) or not bool((got[r, m:] == p).all()))
                res[f"{n}x{p} k{k} kpool{kpool} chunked={chunked}"] = bad
        try:
            top_pools(torch.zeros(2, 4, dtype=torch.float16), torch.zeros(2, dtype=torch.long), 2, 1)
            res["fp16"] = "no error"
        except ValueError as e:
            res["fp16"] = str(e)
        print(json.dumps(res))
    """)
    assert "must be float32" in out.pop("fp16")
    assert all(bad == 0 for bad in out.values()), out
