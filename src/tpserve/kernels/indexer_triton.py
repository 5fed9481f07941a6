"""The DSA indexer's pool compression in one Triton kernel (switch `--indexer-backend`).

Every token computes the pool that ends at it (model/indexer.py `_fill_pools`): the kpool cached keys
and gate vectors of that pool gathered, softmax over the pool's tokens per channel of (gate + ape), the
probabilities rounded to the key dtype, times the keys (rounded), summed in fp32 and rounded into the
pool row (tokens that end no pool write the reserved dummy row). In torch that is ~9 launches per MLA
layer per step (two gathers, casts, add, softmax, product, sum, scatter); GLM-5.3-Flash has 11 MLA
layers. Here one program per token reads 2 x kpool x d 16-bit values (8 KB at kpool 16, d 128) and
writes d: one launch (1.6 us per call in the demo model's decode graph on an H200,
bench/results/decode_profile_indexer_triton_h200.json). Against torch: the same roundings, the softmax's exp and the sum in another
order (a few fp32 ulps before the final rounding; tests/kernels/test_indexer_triton.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _fill_pools_kernel(keys_ptr, gates_ptr, ape_ptr, rows_ptr, target_ptr, pool_ptr,
                       KPOOL: tl.constexpr, D: tl.constexpr, KP: tl.constexpr, DP: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    j = tl.arange(0, KP)
    c = tl.arange(0, DP)
    jm = j < KPOOL
    m = jm[:, None] & (c[None, :] < D)
    rows = tl.load(rows_ptr + t * KPOOL + j, mask=jm, other=0).to(tl.int64)
    at = rows[:, None] * D + c[None, :]
    z = tl.load(gates_ptr + at, mask=m, other=0.0).to(tl.float32) \
        + tl.load(ape_ptr + j[:, None] * D + c[None, :], mask=m, other=0.0).to(tl.float32)
    z = tl.where(m, z, float("-inf"))
    e = tl.exp(z - tl.max(z, axis=0)[None, :])
    e = tl.where(m, e, 0.0)
    keys = tl.load(keys_ptr + at, mask=m, other=0.0)
    probs = (e / tl.sum(e, axis=0)[None, :]).to(keys.dtype)
    prod = (probs.to(tl.float32) * keys.to(tl.float32)).to(keys.dtype).to(tl.float32)
    target = tl.load(target_ptr + t).to(tl.int64)
    tl.store(pool_ptr + target * D + c, tl.sum(prod, axis=0).to(pool_ptr.dtype.element_ty), mask=c < D)


def fill_pools(keys: torch.Tensor, gates: torch.Tensor, ape: torch.Tensor, rows: torch.Tensor, target: torch.Tensor,
               pool: torch.Tensor) -> None:
    """keys, gates [R, d] (flat caches), ape [kpool, d], rows [T, kpool] cache rows of the pool ending at
    each token, target [T] the pool row each token writes -> pool [P, d] written in place."""
    t, kpool = rows.shape
    d = keys.shape[1]
    if not (keys.is_contiguous() and gates.is_contiguous() and pool.is_contiguous()):
        raise ValueError("fill_pools: keys, gates and pool must be contiguous")
    if t:
        _fill_pools_kernel[(t,)](keys, gates, ape.contiguous(), rows.contiguous(), target.contiguous(), pool,
                                 KPOOL=kpool, D=d, KP=triton.next_power_of_2(kpool), DP=triton.next_power_of_2(d),
                                 num_warps=4)
