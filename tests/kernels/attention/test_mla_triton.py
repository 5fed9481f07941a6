"""The sparse MLA kernel (kernels/attention/mla_triton.py, Triton's CPU interpreter) against a float64 reference of the
same attention, and the torch form (model/mla.py `_sparse`) against the same bound.

Bound, per token and head, from the computation (u: unit roundoff of the dtype, u32 = 2^-24): the score of a
selected row is a C-term dot product (error <= C u32 sum_c |q_c lat_c|, fp32 accumulation) rounded to the
dtype (<= u |s|) and scaled; a softmax moves by at most twice the largest score error (relative, per
probability) plus (W + 4) u32 of its own arithmetic; rounding the probabilities to the dtype (normalised in
torch, unnormalised in the kernel) adds u; the value product is a W-term sum (W u32) and the result is
rounded once more (u |o|). All of it times the largest |latent| value selected.
"""

import pytest

from interpreted import run_interpreted

CASES = [  # tokens, heads, C, width, block size, dtype, ranges (None: the kernel's choice), launch config
    (3, 4, 128, 263, 16, "float32", None, None),
    (3, 4, 128, 263, 16, "float32", 1, None),
    (3, 4, 128, 263, 16, "float16", 3, None),
    (2, 20, 96, 50, 8, "float16", None, None),
    (2, 20, 96, 50, 8, "float32", 2, None),
    # other launch shapes (kernels/attention/mla_triton.py PREFILL is h64r64w8s2): more heads and rows per program
    (3, 20, 96, 263, 16, "float16", None, "h32r16w4"),
    (2, 20, 96, 50, 8, "float32", 2, "h16r16w4s2"),
    (3, 4, 128, 263, 16, "float16", 1, "h64r64w8s2"),
    (3, 20, 96, 263, 16, "float32", None, "h64r64w8s2"),
]


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}x{c[1]}x{c[2]}w{c[3]}-{c[5]}-r{c[6]}-{c[7]}" for c in CASES])
def test_sparse_mla_kernel_against_reference(case):
    out = run_interpreted(f"""
        import json, torch
        from tpserve.kernels.attention.mla_triton import SparseConfig, sparse_mla
        n, heads, c, width, bs, dtype, ranges, config = {case!r}
        config = config and SparseConfig.parse(config)
        dtype = getattr(torch, dtype)
        g = torch.Generator().manual_seed(n * heads + width)
        blocks, nb = 40, 24
        latent = torch.randn(blocks * bs, c, generator=g).to(dtype)
        tables = torch.stack([torch.randperm(blocks, generator=g)[:nb] for _ in range(n + 1)])
        seq = torch.tensor([n - i for i in range(n)])              # token i reads table row n - i
        sel = torch.randint(0, nb * bs, (n, width), generator=g)
        sel[:, ::3] = -1                                           # unselected slots
        sel[0] = -1                                                # a token with nothing selected: zeros
        q = (torch.randn(n, heads, c, generator=g) * 0.3).to(dtype)
        scaling = 0.11
        rows = tables[seq[:, None], sel.clamp(min=0) // bs] * bs + sel.clamp(min=0) % bs
        lat = latent[rows]                                         # [n, W, c]
        # float64 reference
        s = torch.einsum("nhc,nwc->nhw", q.double(), lat.double()) * scaling
        s = s.masked_fill((sel < 0)[:, None], float("-inf"))
        p = torch.nan_to_num(s.softmax(-1), nan=0.0)
        ref = torch.einsum("nhw,nwc->nhc", p, lat.double())
        # the torch form of model/mla.py
        st = torch.einsum("bhc,bwc->bhw", q, lat).float() * scaling
        st = st.masked_fill((sel < 0).unsqueeze(1), float("-inf"))
        pt = st.softmax(dim=-1).masked_fill((sel < 0).all(-1)[:, None, None], 0.0).to(dtype)
        torch_form = torch.einsum("bhw,bwc->bhc", pt, lat)
        # queries as an einsum leaves them (head-major strides): the output must still come back [n, h, c]
        got = sparse_mla(q.transpose(0, 1).contiguous().transpose(0, 1), sel, seq, tables, latent, bs, scaling, ranges,
                         config)
        u, u32 = torch.finfo(dtype).eps / 2, 2.0 ** -24
        dots = torch.einsum("nhc,nwc->nhw", q.double().abs(), lat.double().abs()) * scaling
        ds = (c * u32 * dots + u * s.abs().nan_to_num(posinf=0.0, neginf=0.0)).amax(-1)  # [n, h]
        top = lat.double().abs().masked_fill((sel < 0)[..., None], 0).amax((1, 2))[:, None]  # [n, 1]
        bound = (2 * ds + (width + 4) * u32 + u + width * u32) * top + u * ref.abs().amax(-1)
        bound = bound[..., None]
        print(json.dumps({{
            "kernel_excess": float(((got.double() - ref).abs() - bound).max()),
            "torch_excess": float(((torch_form.double() - ref).abs() - bound).max()),
            "kernel_err": float((got.double() - ref).abs().max()),
            "empty_token_zero": bool((got[0] == 0).all()),
            "finite": bool(torch.isfinite(got).all()),
        }}))
    """)
    assert out["finite"] and out["empty_token_zero"], out
    assert out["torch_excess"] <= 0, out  # the bound holds for the reference form too (a sanity check of it)
    assert out["kernel_excess"] <= 0, out
