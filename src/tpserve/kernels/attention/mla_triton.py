"""Sparse MLA attention over the paged latent cache in Triton (switch `--mla-decode-backend`).

Decode and verify tokens (and sparse prefill queries) attend in latent space over the indexer's selected
positions only (model/mla.py `_sparse`). In torch that is the block-table lookup of every selected
position (6 ops), a gather of the selected latent rows ([N, W, C]: 2 MB per token at W = 2051,
C = 512), the score einsum, scaling, two masks, the softmax, casts and the value einsum: 16 ops per MLA
layer in float32 (`bench/op_sites.py`; bf16 adds two casts) and the gathered copy written and read again.
Here each program takes one token, a block of heads and a range of the selection (flash-decoding: at batch
1 a token's ~2k rows are split across programs so more than a few SMs read them), looks each selected
position up in the block table, reads its latent row straight from the paged cache, and keeps an online
softmax; a second kernel combines the ranges (one launch when a single range covers the selection). Ranges
are added until the grid holds two waves of programs on an H200 (`ranges_for`). Measured against the torch
form: BENCHMARKS.md, sparse MLA.

Prefill chunks (`--mla-prefill sparse`, or auto from 8,192 positions) take the same kernel with another launch
shape (`PREFILL`): all 64 heads of a token per program, 64 rows a step, 8 warps, 2 pipeline stages. A token's
selected rows are then read once rather than once per 16-head block, and both dots are 64 rows tall (about
twice as fast as the decode shape there, `bench/mla_sparse_bench.py --prefill`). Its registers spill, and
variants that held fewer (scores over column chunks, split output columns) needed more shared memory than an
SM has or ran slower.

Floors (GLM-5.3-Flash, TP=1: 64 heads, C = 512, W = 2051, bf16): per token 2.1 MB of latent read once
per head block (4 blocks of 16 heads; L2 serves the repeats) and 2 x 64 x 2051 x 512 = 134 MFLOP; at
batch 1 that is ~0.5 us of HBM time and nothing of the tensor cores, so the kernel is latency-bound
(launch + one pass over ~256 rows per program).

Numerics against the torch form: the scores are rounded to the query dtype before scaling, as the torch
einsum's output is; the softmax is online (per range, then combined) and the probabilities are rounded
to the latent dtype before the value product unnormalised rather than normalised, so bf16 results differ
by bf16 roundings (tests/kernels/attention/test_mla_triton.py derives the bound); float32 uses IEEE dots (no TF32).
A token with nothing selected gets zeros, as the torch form (and SDPA for a fully masked row) gives.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

HEAD_BLOCK = 16   # heads per program (tl.dot needs >= 16 rows; fewer heads are masked)
ROW_BLOCK = 32    # selected rows per inner step
FULL_GRID = 264   # two waves on an H200's 132 SMs: ranges fill up to it, never past it (a third wave of a few
# programs measured slower; bench/mla_sparse_bench.py --ranges); past it one range per token


@triton.jit(do_not_specialize=["table_stride"])  # one build for any block-table width
def _sparse_kernel(q_ptr, sel_ptr, seq_ptr, tables_ptr, lat_ptr, m_ptr, l_ptr, acc_ptr, out_ptr,
                   H, W, table_stride, scaling,
                   BS: tl.constexpr, C: tl.constexpr, CP: tl.constexpr, BH: tl.constexpr, BW: tl.constexpr,
                   ITERS: tl.constexpr, S: tl.constexpr, IEEE: tl.constexpr):
    n = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * BH + tl.arange(0, BH)
    s = tl.program_id(2)
    hm = h < H
    c = tl.arange(0, CP)
    cm = c < C
    q = tl.load(q_ptr + (n * H + h)[:, None] * C + c[None, :], mask=hm[:, None] & cm[None, :], other=0.0)
    seq = tl.load(seq_ptr + n).to(tl.int64)
    m_i = tl.full([BH], float("-inf"), tl.float32)
    l_i = tl.zeros([BH], tl.float32)
    acc = tl.zeros([BH, CP], tl.float32)
    for it in range(ITERS):
        w = (s * ITERS + it) * BW + tl.arange(0, BW)
        pos = tl.load(sel_ptr + n * W + w, mask=w < W, other=-1).to(tl.int64)
        ok = pos >= 0
        safe = tl.maximum(pos, 0)
        block = tl.load(tables_ptr + seq * table_stride + safe // BS, mask=ok, other=0).to(tl.int64)
        row = block * BS + safe % BS
        lat = tl.load(lat_ptr + row[:, None] * C + c[None, :], mask=ok[:, None] & cm[None, :], other=0.0).to(q.dtype)
        if IEEE:
            raw = tl.dot(q, tl.trans(lat), input_precision="ieee")
        else:
            raw = tl.dot(q, tl.trans(lat))
        score = raw.to(q.dtype).to(tl.float32) * scaling
        score = tl.where(ok[None, :], score, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(score, axis=1))
        live = m_new > float("-inf")
        alpha = tl.where(live, tl.exp(m_i - m_new), 1.0)
        p = tl.where(live[:, None], tl.exp(score - m_new[:, None]), 0.0)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if IEEE:
            acc = acc * alpha[:, None] + tl.dot(p.to(lat.dtype), lat, input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(lat.dtype), lat)
        m_i = m_new
    if S == 1:  # one range: normalise and write the output
        o = tl.where(l_i[:, None] > 0, acc / tl.maximum(l_i, 1e-30)[:, None], 0.0)
        tl.store(out_ptr + (n * H + h)[:, None] * C + c[None, :], o.to(out_ptr.dtype.element_ty),
                 mask=hm[:, None] & cm[None, :])
    else:
        at = (n * H + h) * S + s
        tl.store(m_ptr + at, m_i, mask=hm)
        tl.store(l_ptr + at, l_i, mask=hm)
        tl.store(acc_ptr + at[:, None] * C + c[None, :], acc, mask=hm[:, None] & cm[None, :])


@triton.jit
def _combine_kernel(m_ptr, l_ptr, acc_ptr, out_ptr, S: tl.constexpr, SP: tl.constexpr, C: tl.constexpr,
                    CP: tl.constexpr):
    nh = tl.program_id(0).to(tl.int64)
    s = tl.arange(0, SP)
    sm = s < S
    c = tl.arange(0, CP)
    m = tl.load(m_ptr + nh * S + s, mask=sm, other=float("-inf"))
    top = tl.max(m, axis=0)
    w = tl.where(m > float("-inf"), tl.exp(m - top), 0.0)
    total = tl.sum(w * tl.load(l_ptr + nh * S + s, mask=sm, other=0.0), axis=0)
    acc = tl.load(acc_ptr + (nh * S + s)[:, None] * C + c[None, :], mask=sm[:, None] & (c[None, :] < C), other=0.0)
    o = tl.sum(w[:, None] * acc, axis=0)
    o = tl.where(total > 0, o / tl.maximum(total, 1e-30), 0.0)
    tl.store(out_ptr + nh * C + c, o.to(out_ptr.dtype.element_ty), mask=c < C)


@dataclass(frozen=True)
class SparseConfig:
    """A launch shape of `_sparse_kernel`."""
    heads: int = HEAD_BLOCK  # heads per program (the rows of both dots)
    rows: int = ROW_BLOCK    # selected rows per inner step
    warps: int = 4
    stages: int | None = None  # Triton's software pipelining depth (its default when None)

    def __str__(self) -> str:
        return f"h{self.heads}r{self.rows}w{self.warps}s{self.stages or 'd'}"

    @classmethod
    def parse(cls, text: str) -> "SparseConfig":
        """'h64r64w8s2' (as str() writes it; 'sd' or no s: Triton's default stages)."""
        m = re.fullmatch(r"h(\d+)r(\d+)w(\d+)(?:s(\d+|d))?", text)
        if not m:
            raise ValueError(f"sparse MLA config {text!r}: expected the form h64r64w8s2")
        h, r, w, st = m.groups()
        return cls(int(h), int(r), int(w), None if st in (None, "d") else int(st))


DECODE = SparseConfig()
# Prefill chunks: all 64 heads of a token in one program, so each selected row is read once (not once per 16
# heads) and both dots are 64 rows tall. Decode and verify steps keep DECODE: their configuration must not
# depend on a graph bucket's padding (tokens equal with graphs on and off).
PREFILL = SparseConfig(64, 64, 8, 2)


def ranges_for(tokens: int, heads: int, width: int, head_block: int = HEAD_BLOCK, row_block: int = ROW_BLOCK) -> int:
    """How many ranges the selection of each token is split into: enough programs for the GPU, none empty."""
    programs = tokens * triton.cdiv(heads, head_block)
    if programs >= FULL_GRID:
        return 1
    return max(1, min(triton.cdiv(width, row_block), FULL_GRID // programs))


def sparse_mla(q_lat: torch.Tensor, sel: torch.Tensor, token_seq: torch.Tensor, block_tables: torch.Tensor,
               latent: torch.Tensor, block_size: int, scaling: float, ranges: int | None = None,
               config: SparseConfig | None = None) -> torch.Tensor:
    """q_lat [N, H, C] (queries with kv_b_proj's key half absorbed), sel [N, W] selected positions (-1:
    none), token_seq [>= N] the block-table row of each token, block_tables [B, nb], latent [R, C] (the
    flat paged cache) -> attention output in latent space [N, H, C], q_lat's dtype. `config`: the launch
    shape (DECODE when None; model/mla.py passes PREFILL for prefill chunks)."""
    n, heads, c = q_lat.shape
    width = sel.shape[1]
    if latent.shape[1] != c or not latent.is_contiguous():
        raise ValueError(f"sparse_mla: latent must be a contiguous [rows, {c}] cache, got {tuple(latent.shape)}")
    cfg = config or DECODE
    if cfg.heads > max(16, triton.next_power_of_2(heads)):  # no program of masked heads only (TP > 1, small models)
        cfg = replace(cfg, heads=max(16, triton.next_power_of_2(heads)))
    q_lat = q_lat.contiguous()
    out = torch.empty(n, heads, c, dtype=q_lat.dtype, device=q_lat.device)  # (empty_like keeps an einsum's strides)
    if n == 0:
        return out
    cp = triton.next_power_of_2(c)
    s = ranges or ranges_for(n, heads, width, cfg.heads, cfg.rows)
    iters = triton.cdiv(triton.cdiv(width, s), cfg.rows)
    s = triton.cdiv(width, iters * cfg.rows)  # no empty range
    if s > 1:
        m = torch.empty(n * heads * s, dtype=torch.float32, device=q_lat.device)
        l_ = torch.empty_like(m)
        acc = torch.empty(n * heads * s, c, dtype=torch.float32, device=q_lat.device)
    else:
        m = l_ = acc = out  # not written
    tables = block_tables.contiguous()
    grid = (n, triton.cdiv(heads, cfg.heads), s)
    extra = {} if cfg.stages is None else {"num_stages": cfg.stages}
    _sparse_kernel[grid](q_lat, sel.contiguous(), token_seq.contiguous(), tables, latent, m, l_, acc,
                         out, heads, width, tables.stride(0), scaling, BS=block_size, C=c, CP=cp, BH=cfg.heads,
                         BW=cfg.rows, ITERS=iters, S=s, IEEE=q_lat.dtype == torch.float32, num_warps=cfg.warps, **extra)
    if s > 1:
        _combine_kernel[(n * heads,)](m, l_, acc, out, S=s, SP=triton.next_power_of_2(s), C=c, CP=cp, num_warps=4)
    return out
