"""One Triton kernel for the mHC weights (norms/mhc.py has the math and the torch reference).

Each program takes BLOCK_T tokens in one warp, a token per lane: tensors are laid out [i, j, token] with the
token innermost, so Triton's default layout gives each lane its own token's n x n comb matrix (n padded to a
power of two, the padding kept at zero) in registers, and the softmax and every Sinkhorn sum run inside the
lane: no shuffles or shared-memory transposes between the row and column sums (a [token, i, j] layout over
four warps needed them and was slower). It reads and writes (2+n)*n floats per token; the cost is the serial
Sinkhorn chain (2 * sinkhorn_iters sums and divisions), one launch instead of ~120.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tpserve.kernels.launch import pdl_triton


@triton.jit
def _hc_weights_kernel(mixed_ptr, base_ptr, scale_ptr, pre_ptr, post_ptr, comb_ptr, T, eps,
                       N: tl.constexpr, NP: tl.constexpr, ITERS: tl.constexpr, BLOCK_T: tl.constexpr,
                       PDL: tl.constexpr):
    pdl_triton.start(PDL)  # (kernels/launch/pdl_triton.py)
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    t_ok = t < T
    i = tl.arange(0, NP)
    i_ok = i < N
    width: tl.constexpr = (2 + N) * N
    row = mixed_ptr + t.to(tl.int64) * width                          # [BLOCK_T]
    s_pre = tl.load(scale_ptr)
    s_post = tl.load(scale_ptr + 1)
    s_comb = tl.load(scale_ptr + 2)

    m2 = i_ok[:, None] & t_ok[None, :]                                # [NP, BLOCK_T]
    pre_w = tl.load(row[None, :] + i[:, None], mask=m2, other=0.0)
    post_w = tl.load(row[None, :] + N + i[:, None], mask=m2, other=0.0)
    pre = tl.sigmoid(pre_w * s_pre + tl.load(base_ptr + i, mask=i_ok, other=0.0)[:, None]) + eps
    post = 2.0 * tl.sigmoid(post_w * s_post + tl.load(base_ptr + N + i, mask=i_ok, other=0.0)[:, None])
    out2 = t.to(tl.int64)[None, :] * N + i[:, None]
    tl.store(pre_ptr + out2, pre, mask=m2)
    tl.store(post_ptr + out2, post, mask=m2)

    rc = i[:, None] * N + i[None, :]                                  # [NP, NP]: offset of (row i, column j)
    rc_ok = i_ok[:, None] & i_ok[None, :]
    m3 = rc_ok[:, :, None] & t_ok[None, None, :]                      # [NP, NP, BLOCK_T]
    z = tl.load(row[None, None, :] + 2 * N + rc[:, :, None], mask=m3, other=0.0) * s_comb
    z = z + tl.load(base_ptr + 2 * N + rc, mask=rc_ok, other=0.0)[:, :, None]
    z = tl.where(rc_ok[:, :, None], z, -float("inf"))
    z = z - tl.max(z, axis=1)[:, None, :]                             # softmax over j (the torch dim -1)
    e = tl.where(rc_ok[:, :, None], tl.exp(z), 0.0)
    comb = e / tl.sum(e, axis=1)[:, None, :]
    comb = tl.where(rc_ok[:, :, None], comb + eps, 0.0)
    comb = comb / (tl.sum(comb, axis=0)[None, :, :] + eps)            # over i (dim -2)
    for _ in range(ITERS - 1):
        comb = comb / (tl.sum(comb, axis=1)[:, None, :] + eps)
        comb = comb / (tl.sum(comb, axis=0)[None, :, :] + eps)
    tl.store(comb_ptr + t.to(tl.int64)[None, None, :] * (N * N) + rc[:, :, None], comb, mask=m3)


def hc_weights_triton(mixed: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, n: int, iters: int,
                      eps: float, pdl: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Same contract as hc_weights_torch: mixed [T, (2+n)*n] fp32 -> pre, post [T, n], comb [T, n, n]. pdl:
    launched as a programmatic dependent of the kernel before (kernels/launch/pdl_triton.py; sm_90+)."""
    mixed, base, scale = mixed.float().contiguous(), base.float().contiguous(), scale.float().contiguous()
    t = mixed.shape[0]
    pre = torch.empty(t, n, dtype=torch.float32, device=mixed.device)
    post = torch.empty_like(pre)
    comb = torch.empty(t, n, n, dtype=torch.float32, device=mixed.device)
    if t:
        block = 32  # one warp, a token per lane
        _hc_weights_kernel[(triton.cdiv(t, block),)](mixed, base, scale, pre, post, comb, t, eps, N=n,
                                                     NP=triton.next_power_of_2(n), ITERS=iters, BLOCK_T=block,
                                                     num_warps=1, PDL=pdl, launch_pdl=pdl)
    return pre, post, comb
