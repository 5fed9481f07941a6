"""The KDA layer's small per-token ops before the delta rule, in two Triton kernels (switch
`--kda-prep-backend`).

In torch a decode step spends ~20 launches per KDA layer here: the short conv (gather the conv states
at the slots, concatenate, four products and three adds, SiLU, cast, scatter the new states), the
forget gate (cast, bias add, exp of A_log, product, sigmoid, scale), beta's sigmoid, and the copies
that make q, k and v contiguous for fla's kernel. GLM-5.3-Flash has 34 KDA layers: ~680 launches.

- `conv_rows`: B sequences of N rows each (N = 1: decode steps, which also advance the conv state in
  place at the slots; N = 1 + k: the rows of a verify step, states read only). Row r of a sequence is
  silu(sum_i w[c, i] * window[r + i]) over its window (the sequence's k - 1 state entries, then its
  rows), products and sum in fp32 in tap order, exactly one code path for decode and verify rows: a
  verify row equals the decode step it stands for, bit for bit (speculative decoding's exactness
  rests on it). q, k and v come out as three contiguous [T, C/3] blocks (no copies for fla).
- `conv_chunk`: the same conv over one sequence's prefill chunk (rows in parallel tiles, the state read for
  the first k - 1 rows, the new state returned).
- `gate_beta`: the forget gate (lower_bound * sigmoid(exp(A_log) * (f + dt_bias)); the softplus form of
  configs without a lower bound keeps torch) in fp32 and beta = sigmoid(b), for every row of a forward.

Floors: both read and write a few KB per token (the conv state, [T, 3C] activations); at batch 1 each is one
launch against ~20. Against the torch forms (attention/conv.py, attention/kda.gate_beta): the same formulas and
order, but the compiler may fuse a product and an add (FMA), and exp may round differently: a few fp32 ulps
before the final rounding (tests/kernels/attention/test_kda_prep.py states the bounds).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tpserve.kernels.launch import pdl_triton


@triton.jit
def _conv_rows_kernel(x_ptr, stride_x, pool_ptr, slots_ptr, w_ptr, out_ptr, stride_part, stride_row, C, PART,
                      N: tl.constexpr, KW: tl.constexpr, UPDATE: tl.constexpr, BLOCK_C: tl.constexpr,
                      PDL: tl.constexpr):
    pdl_triton.start(PDL)  # (kernels/launch/pdl_triton.py)
    b = tl.program_id(0)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    ok = c < C
    slot = tl.load(slots_ptr + b).to(tl.int64)
    state = pool_ptr + slot * C * (KW - 1) + c * (KW - 1)    # [C, KW - 1] per slot, contiguous
    rows = x_ptr + (b * N).to(tl.int64) * stride_x + c
    part = c // PART
    dst = out_ptr + part.to(tl.int64) * stride_part + (c - part * PART)
    for r in tl.static_range(N):
        acc = tl.zeros([BLOCK_C], dtype=tl.float32)
        for i in tl.static_range(KW):
            if r + i < KW - 1:
                xi = tl.load(state + r + i, mask=ok, other=0.0)
            else:
                xi = tl.load(rows + (r + i - (KW - 1)) * stride_x, mask=ok, other=0.0)
            p = xi.to(tl.float32) * tl.load(w_ptr + c * KW + i, mask=ok, other=0.0)
            if i == 0:
                acc = p
            else:
                acc = acc + p
        y = acc / (1.0 + tl.exp(-acc))
        tl.store(dst + (b * N + r).to(tl.int64) * stride_row, y.to(out_ptr.dtype.element_ty), mask=ok)
    if UPDATE:  # the last KW - 1 inputs become the state (entries moved down: read before written)
        for j in tl.static_range(KW - 1):
            if N + j < KW - 1:
                v = tl.load(state + N + j, mask=ok, other=0.0)
            else:
                v = tl.load(rows + (N + j - (KW - 1)) * stride_x, mask=ok, other=0.0)
            tl.store(state + j, v.to(pool_ptr.dtype.element_ty), mask=ok)


def conv_rows(x: torch.Tensor, pool: torch.Tensor, slots: torch.Tensor, weight: torch.Tensor, n: int,
              update: bool, out: torch.Tensor | None = None,
              pdl: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [B * n, C] (C = q|k|v channels, rows sequence-major); pool [S, C, k-1] conv states; slots [B];
    weight [C, k] fp32 -> (q, k, v) [B * n, C/3] each, in x.dtype: views of `out` [B * n, C] when given
    (written in place), else of one new [3, B * n, C/3] buffer. update (n == 1 only): the slots' states
    advance by the row. pdl: launched as a programmatic dependent of the kernel before (launch/pdl_triton.py)."""
    t, c = x.shape
    if update and n != 1:
        raise ValueError("conv_rows: update needs one row per sequence")
    if not pool.is_contiguous() or x.stride(1) != 1 or c % 3:
        raise ValueError("conv_rows: needs a contiguous state pool, unit-stride channels and q|k|v thirds")
    part = c // 3
    if out is None:
        buf = torch.empty(3, t, part, dtype=x.dtype, device=x.device)
        stride_part, stride_row, parts = t * part, part, tuple(buf.unbind(0))
    else:
        buf = out
        stride_part, stride_row, parts = part, out.stride(0), tuple(out.split(part, dim=-1))
    b = t // n
    if b:
        block = min(1024, triton.next_power_of_2(c))
        _conv_rows_kernel[(b, triton.cdiv(c, block))](
            x, x.stride(0), pool, slots, weight.contiguous(), buf, stride_part, stride_row, c, part, N=n,
            KW=weight.shape[1], UPDATE=update, BLOCK_C=block, num_warps=4, PDL=pdl, launch_pdl=pdl)
    return parts


@triton.jit
def _conv_chunk_kernel(x_ptr, stride_x, state_ptr, w_ptr, out_ptr, stride_out, T, C,
                       KW: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr):
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    t_ok, c_ok = t < T, c < C
    acc = tl.zeros([BLOCK_T, BLOCK_C], dtype=tl.float32)
    for i in tl.static_range(KW):
        r = t + (i - (KW - 1))  # the input row this tap reads; before the chunk: the state's entry KW - 1 + r
        from_x = (r >= 0) & t_ok
        xi = tl.load(x_ptr + tl.maximum(r, 0).to(tl.int64)[:, None] * stride_x + c[None, :],
                     mask=from_x[:, None] & c_ok[None, :], other=0.0)
        from_state = (r < 0) & t_ok
        si = tl.load(state_ptr + c[None, :] * (KW - 1) + (KW - 1 + tl.minimum(r, -1))[:, None],
                     mask=from_state[:, None] & c_ok[None, :], other=0.0)
        p = (xi.to(tl.float32) + si.to(x_ptr.dtype.element_ty).to(tl.float32)) * tl.load(w_ptr + c * KW + i, mask=c_ok, other=0.0)[None, :]
        if i == 0:
            acc = p
        else:
            acc = acc + p
    y = acc / (1.0 + tl.exp(-acc))
    tl.store(out_ptr + t.to(tl.int64)[:, None] * stride_out + c[None, :], y.to(out_ptr.dtype.element_ty),
             mask=t_ok[:, None] & c_ok[None, :])


def conv_chunk(x: torch.Tensor, state: torch.Tensor, weight: torch.Tensor, out: torch.Tensor | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """A prefill chunk of one sequence: x [n, C] after its conv state [C, k-1] -> (silu(conv) [n, C] in x.dtype,
    written into `out` when given; the new state [C, k-1], the chunk's last k - 1 inputs), as
    attention/conv.causal_conv_seq (products and sum in fp32 in tap order, where torch's conv1d sums in its own
    order). In torch the chunk is transposed, concatenated after the state, cast to fp32, convolved, passed
    through SiLU and transposed back, a large share of a long prefill; the floor is one read of x and one write
    of out."""
    n, c = x.shape
    k = weight.shape[1]
    if x.stride(1) != 1 or state.shape != (c, k - 1):
        raise ValueError(f"conv_chunk: x {tuple(x.shape)} needs unit-stride channels and state [C, k-1], "
                         f"got {tuple(state.shape)}")
    if out is None:
        out = torch.empty(n, c, dtype=x.dtype, device=x.device)
    state_in = state.contiguous()
    if n:
        block_t, block_c = 32, min(128, triton.next_power_of_2(c))
        _conv_chunk_kernel[(triton.cdiv(n, block_t), triton.cdiv(c, block_c))](
            x, x.stride(0), state_in, weight.contiguous(), out, out.stride(0), n, c, KW=k, BLOCK_T=block_t,
            BLOCK_C=block_c, num_warps=4)
    tail = torch.cat([state_in.to(x.dtype), x[max(n - (k - 1), 0):].t()], dim=-1)
    return out, tail[:, tail.shape[1] - (k - 1):]


@triton.jit
def _gate_beta_kernel(f_ptr, stride_f, dt_ptr, alog_ptr, b_ptr, stride_b, g_ptr, beta_ptr, C, H, lower,
                      K: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_H: tl.constexpr, PDL: tl.constexpr):
    pdl_triton.start(PDL)  # (kernels/launch/pdl_triton.py)
    t = tl.program_id(0).to(tl.int64)
    blk = tl.program_id(1)
    c = blk * BLOCK_C + tl.arange(0, BLOCK_C)
    ok = c < C
    g = tl.load(f_ptr + t * stride_f + c, mask=ok, other=0.0).to(tl.float32) + tl.load(dt_ptr + c, mask=ok, other=0.0)
    rate = tl.exp(tl.load(alog_ptr + c // K, mask=ok, other=0.0))
    tl.store(g_ptr + t * C + c, lower * tl.sigmoid(rate * g), mask=ok)
    if blk == 0:
        h = tl.arange(0, BLOCK_H)
        h_ok = h < H
        z = tl.load(b_ptr + t * stride_b + h, mask=h_ok, other=0.0)
        beta = tl.sigmoid(z.to(tl.float32))
        tl.store(beta_ptr + t * H + h, beta.to(beta_ptr.dtype.element_ty), mask=h_ok)


def gate_beta(f: torch.Tensor, dt_bias: torch.Tensor, a_log: torch.Tensor, b: torch.Tensor, head_dim: int,
              lower_bound: float, pdl: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """f [T, H*K] (f_b_proj output), dt_bias [H*K], A_log [H] (fp32), b [T, H] (b_proj output) ->
    (g [T, H, K] fp32 log decay, beta [T, H] in b.dtype), as model/kda.py's torch forms (the lower-bound
    form of the gate: lower_bound * sigmoid(exp(A_log) * (f + dt_bias))). pdl: as conv_rows."""
    if lower_bound is None:
        raise ValueError("gate_beta: needs a lower bound (the softplus gate keeps torch)")
    t, c = f.shape
    h = c // head_dim
    g = torch.empty(t, h, head_dim, dtype=torch.float32, device=f.device)
    beta = torch.empty(t, h, dtype=b.dtype, device=b.device)
    if t:
        block = min(2048, triton.next_power_of_2(c))
        _gate_beta_kernel[(t, triton.cdiv(c, block))](
            f, f.stride(0), dt_bias.float().contiguous(), a_log.float().contiguous(), b, b.stride(0), g, beta, c, h,
            float(lower_bound), K=head_dim, BLOCK_C=block,
            BLOCK_H=triton.next_power_of_2(h), num_warps=4, PDL=pdl, launch_pdl=pdl)
    return g, beta
