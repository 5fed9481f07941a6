"""The DSA indexer's pool compression, decode scores and selection expansion, one Triton kernel each (switch
`--indexer-backend`).

Every token that completes a pool computes it (model/indexer.py `_fill_pools`; the kernel finds the pool's
cache rows in the block table itself and returns at once for the other tokens): the kpool cached keys
and gate vectors of that pool gathered, softmax over the pool's tokens per channel of (gate + ape), the
probabilities rounded to the key dtype, times the keys (rounded), summed in fp32 and rounded into the
pool row (tokens that end no pool write the reserved dummy row). In torch that is ~9 launches per MLA
layer per step (two gathers, casts, add, softmax, product, sum, scatter); GLM-5.3-Flash has 11 MLA
layers. Here one program per token reads 2 x kpool x d 16-bit values (8 KB at kpool 16, d 128) and
writes d: one launch. Against torch: the same roundings, the softmax's exp and the sum in another order (a
few fp32 ulps before the final rounding; tests/kernels/attention/test_indexer_triton.py).

Decode scores (model/indexer.py `_select_tokens`): a decode / verify token scores every complete pool of
its own sequence, sum_h w_h relu(q_h . key / sqrt(d)). In torch, over a graph step's fixed width (every
pool the block table can address: 8,192 at 131,072 positions and kpool 16), that is the pools' cache rows
(14 ops, once per step), a gather of [n, P, d] pool keys, fp32 copies, two matmuls, relu, the mask
(7 ops per layer in float32, counted with `bench/op_sites.py`; bf16 adds two copies) and ~2 MB gathered
per token. Here a program per (token, 64 pools) looks the pools
up in the block table and reads them in place; blocks of pools not complete at the token's position only
write the mask value, so the work follows the context, not the width. Floors per token at 1k context
(64 pools, GLM-5.3-Flash: 32 heads, d 128): 16 KB of keys and 0.5 MFLOP: launch-bound. 16-bit inputs
dot on the tensor cores (exact products, fp32 sums), float32 with IEEE dots; against torch's fp32 matmuls
only the summation order differs (bound in the test). The engine's decode steps gained from it (BENCHMARKS.md,
the indexer's decode scores).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit(do_not_specialize=["table_stride"])  # one build for any block-table width
def _fill_pools_kernel(keys_ptr, gates_ptr, ape_ptr, pos_ptr, seq_ptr, tables_ptr, pool_ptr, table_stride,
                       BS: tl.constexpr, KPOOL: tl.constexpr, D: tl.constexpr, KP: tl.constexpr, DP: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + t).to(tl.int64)
    if (pos + 1) % KPOOL != 0:  # this token completes no pool: nothing to write
        return
    seq = tl.load(seq_ptr + t).to(tl.int64)
    j = tl.arange(0, KP)
    c = tl.arange(0, DP)
    jm = j < KPOOL
    m = jm[:, None] & (c[None, :] < D)
    toks = pos + 1 - KPOOL + j                                   # the pool's tokens, in its sequence
    block = tl.load(tables_ptr + seq * table_stride + toks // BS, mask=jm, other=0).to(tl.int64)
    rows = block * BS + toks % BS
    at = rows[:, None] * D + c[None, :]
    z = tl.load(gates_ptr + at, mask=m, other=0.0).to(tl.float32) \
        + tl.load(ape_ptr + j[:, None] * D + c[None, :], mask=m, other=0.0).to(tl.float32)
    z = tl.where(m, z, float("-inf"))
    e = tl.exp(z - tl.max(z, axis=0)[None, :])
    e = tl.where(m, e, 0.0)
    keys = tl.load(keys_ptr + at, mask=m, other=0.0)
    probs = (e / tl.sum(e, axis=0)[None, :]).to(keys.dtype)
    prod = (probs.to(tl.float32) * keys.to(tl.float32)).to(keys.dtype).to(tl.float32)
    first = pos + 1 - KPOOL
    target = (tl.load(tables_ptr + seq * table_stride + first // BS).to(tl.int64) * BS + first % BS) // KPOOL
    tl.store(pool_ptr + target * D + c, tl.sum(prod, axis=0).to(pool_ptr.dtype.element_ty), mask=c < D)


def fill_pools(keys: torch.Tensor, gates: torch.Tensor, ape: torch.Tensor, positions: torch.Tensor,
               token_seq: torch.Tensor, block_tables: torch.Tensor, block_size: int, pool: torch.Tensor) -> None:
    """keys, gates [R, d] (flat caches), ape [kpool, d], positions / token_seq [T] (each token's position and
    block-table row), block_tables [B, nb] -> the pooled key of every pool a token completes, written into
    pool [P, d] (row block * bs / kpool + offset / kpool); tokens that complete none write nothing."""
    t = positions.shape[0]
    kpool, d = ape.shape
    if not (keys.is_contiguous() and gates.is_contiguous() and pool.is_contiguous()):
        raise ValueError("fill_pools: keys, gates and pool must be contiguous")
    if t:
        tables = block_tables.contiguous()
        _fill_pools_kernel[(t,)](keys, gates, ape.contiguous(), positions.contiguous(), token_seq[:t].contiguous(),
                                 tables, pool, tables.stride(0), BS=block_size, KPOOL=kpool, D=d,
                                 KP=triton.next_power_of_2(kpool), DP=triton.next_power_of_2(d), num_warps=4)


@triton.jit(do_not_specialize=["table_stride"])  # one build for any block-table width
def _decode_scores_kernel(q_ptr, w_ptr, pos_ptr, seq_ptr, tables_ptr, pool_ptr, out_ptr, P, table_stride, scale, fill,
                          H: tl.constexpr, D: tl.constexpr, HP: tl.constexpr, DP: tl.constexpr, BS: tl.constexpr,
                          KPOOL: tl.constexpr, BP: tl.constexpr, IEEE: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    first = tl.program_id(1) * BP
    j = first + tl.arange(0, BP)
    pos = tl.load(pos_ptr + t).to(tl.int64)
    if (first + 1) * KPOOL > pos + 1:  # no pool of this block is complete yet (most of a fixed-width step)
        tl.store(out_ptr + t * P + j, tl.full([BP], fill, tl.float32), mask=j < P)
        return
    seq = tl.load(seq_ptr + t).to(tl.int64)
    visible = ((j + 1) * KPOOL <= pos + 1) & (j < P)
    h = tl.arange(0, HP)
    d = tl.arange(0, DP)
    hm, dm = h < H, d < D
    q = tl.load(q_ptr + (t * H + h)[:, None] * D + d[None, :], mask=hm[:, None] & dm[None, :], other=0.0)
    w = tl.load(w_ptr + t * H + h, mask=hm, other=0.0)
    start = j.to(tl.int64) * KPOOL
    block = tl.load(tables_ptr + seq * table_stride + start // BS, mask=visible, other=0).to(tl.int64)
    row = (block * BS + start % BS) // KPOOL
    keys = tl.load(pool_ptr + row[:, None] * D + d[None, :], mask=visible[:, None] & dm[None, :], other=0.0)
    if IEEE:  # float32: no TF32
        s = tl.dot(keys.to(tl.float32), tl.trans(q.to(tl.float32)), input_precision="ieee")  # [BP, HP]
    else:  # 16-bit: exact products on the tensor cores, fp32 sums
        s = tl.dot(keys.to(q.dtype), tl.trans(q))
    s = tl.maximum(s * scale, 0.0)
    score = tl.sum(s * w[None, :], axis=1)
    tl.store(out_ptr + t * P + j, tl.where(visible, score, fill), mask=j < P)


def decode_scores(q: torch.Tensor, w: torch.Tensor, positions: torch.Tensor, token_seq: torch.Tensor,
                  block_tables: torch.Tensor, pool: torch.Tensor, block_size: int, kpool: int,
                  n_pools: int) -> torch.Tensor:
    """Index scores of decode / verify tokens over the pools of their own sequence, read in place from the
    paged pool cache: q [n, H, d], w [n, H] fp32 (head weights, scale folded in), positions / token_seq [n],
    block_tables [B, nb], pool [rows, d] -> fp32 [n, n_pools], sum_h w_h relu(q_h . key / sqrt(d)); pools
    not yet complete at a token's position get float32's lowest value (model/indexer.py `_expand`)."""
    n, heads, d = q.shape
    out = torch.empty(n, n_pools, dtype=torch.float32, device=q.device)
    if n == 0 or n_pools == 0:
        return out
    if not pool.is_contiguous():
        raise ValueError("decode_scores: the pool cache must be contiguous")
    tables = block_tables.contiguous()
    bp = 64
    _decode_scores_kernel[(n, triton.cdiv(n_pools, bp))](
        q.contiguous(), w.float().contiguous(), positions.contiguous(), token_seq.contiguous(), tables, pool, out,
        n_pools, tables.stride(0), d ** -0.5, torch.finfo(torch.float32).min, H=heads, D=d,
        HP=max(16, triton.next_power_of_2(heads)), DP=max(16, triton.next_power_of_2(d)), BS=block_size, KPOOL=kpool,
        BP=bp, IEEE=q.dtype == torch.float32, num_warps=4)
    return out


@triton.jit
def _expand_kernel(chosen_ptr, pos_ptr, out_ptr, K, W, KEEP: tl.constexpr, KPOOL: tl.constexpr, TAIL: tl.constexpr,
                   BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, BLOCK)
    pos = tl.load(pos_ptr + t).to(tl.int64)
    slot = c // KPOOL
    picked = c < K * KPOOL
    pool = tl.load(chosen_ptr + t * K + slot, mask=picked, other=0).to(tl.int64)
    val = tl.where(picked & ((pool + 1) * KPOOL <= pos + 1), pool * KPOOL + c % KPOOL, -1)
    if TAIL:
        count = (pos + 1) % KPOOL
        o = c - KEEP * KPOOL
        val = tl.where((o >= 0) & (o < count), pos + 1 - count + o, val)
    tl.store(out_ptr + t * W + c, val, mask=c < W)


def expand_selection(chosen: torch.Tensor, positions: torch.Tensor, width: int, pools_to_keep: int, kpool: int,
                     tail: bool) -> torch.Tensor:
    """The chosen pools of each decode / verify token as token positions, plus its unfinished pool's
    positions (model/indexer.py `_expand` and `_tail`, for scores whose invisible pools are masked already):
    chosen [n, k] pool indices (k <= pools_to_keep), positions [n] -> [n, width] long, -1 = none."""
    n, k = chosen.shape
    out = torch.empty(n, width, dtype=torch.long, device=chosen.device)
    if n:
        _expand_kernel[(n,)](chosen.contiguous(), positions.contiguous(), out, k, width, KEEP=pools_to_keep,
                             KPOOL=kpool, TAIL=tail and kpool > 1, BLOCK=triton.next_power_of_2(width), num_warps=4)
    return out


@triton.jit
def _packed(score, j):
    """Order-preserving int64 keys: the fp32 score's bits made signed-monotone in the high word, the pool
    index reversed in the low word (equal scores: the lower index ranks higher)."""
    bits = score.to(tl.int32, bitcast=True)
    mono = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    return (mono.to(tl.int64) << 32) | (4294967295 - j.to(tl.int64))


# K (the pools kept) is a runtime argument in the three top-pools kernels: one build per tile C, not one per k
# (k follows the context up to the indexer's top-k pools).
@triton.jit
def _top_pools_kernel(scores_ptr, pos_ptr, out_ptr, P, K, KPOOL: tl.constexpr, C: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + t).to(tl.int64)
    v = tl.minimum((pos + 1) // KPOOL, P)        # pools complete at this token: the only ones it may pick
    i = tl.arange(0, C)
    row = scores_ptr + t * P
    empty = tl.full([C], -1, tl.int64) << 63
    ok = i < v
    key = tl.where(ok, _packed(tl.load(row + i, mask=ok, other=0.0), i), empty)
    key = tl.sort(key, descending=True)
    for c0 in range(C, v, C - K):                # the best K stay in slots 0..K-1; the next C-K pools fill the rest
        j = c0 - K + i
        new = (i >= K) & (j < v)
        key = tl.where(i >= K, tl.where(new, _packed(tl.load(row + j, mask=new, other=0.0), j), empty), key)
        key = tl.sort(key, descending=True)
    idx = tl.where(key == empty, P, 4294967295 - (key & 4294967295))
    tl.store(out_ptr + t * K + i, idx, mask=i < K)


@triton.jit
def _top_pools_chunk_kernel(scores_ptr, pos_ptr, part_ptr, P, NCH, K, KPOOL: tl.constexpr,
                            C: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    v = tl.minimum((tl.load(pos_ptr + t).to(tl.int64) + 1) // KPOOL, P)
    if c * C < v:  # chunks past the complete pools: never read by the merge
        j = c * C + tl.arange(0, C)
        ok = j < v
        key = tl.where(ok, _packed(tl.load(scores_ptr + t * P + j, mask=ok, other=0.0), j),
                       tl.full([C], -1, tl.int64) << 63)
        key = tl.sort(key, descending=True)
        i = tl.arange(0, C)
        tl.store(part_ptr + (t * NCH + c) * K + i, key, mask=i < K)


@triton.jit
def _top_pools_merge_kernel(part_ptr, pos_ptr, out_ptr, P, NCH, K, KPOOL: tl.constexpr,
                            C: tl.constexpr, M: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    v = tl.minimum((tl.load(pos_ptr + t).to(tl.int64) + 1) // KPOOL, P)
    i = tl.arange(0, M)
    empty = tl.full([M], -1, tl.int64) << 63
    ok = (i // K < tl.cdiv(v, C)) & (i < NCH * K)
    key = tl.load(part_ptr + t * NCH * K + i, mask=ok, other=0)
    key = tl.where(ok, key, empty)
    if v > C:  # one chunk: its keys are sorted already
        key = tl.sort(key, descending=True)
    idx = tl.where(key == empty, P, 4294967295 - (key & 4294967295))
    tl.store(out_ptr + t * K + i, idx, mask=i < K)


def top_pools(scores: torch.Tensor, positions: torch.Tensor, k: int, kpool: int,
              chunked: bool | None = None) -> torch.Tensor:
    """The k best pools of each decode / verify token among those complete at its position (model/indexer.py
    `_expand`, in place of `scores.topk(k).indices`): scores [n, P] fp32, positions [n] -> [n, k] int64 pool
    indices, best first (equal scores: lower index first), P where fewer than k pools are complete
    (expand_selection turns those into -1). The work follows the context: pools past a token's position are
    never read. Single kernel (chunked False): the complete pools go through a register sort of C keys, C - k
    new ones per round. Chunked (True): chunks of C pools sorted by parallel programs (their best k kept), then
    one merge sort of those (skipped when one chunk holds every complete pool). None (default): chunked when
    the row holds more than one chunk (P > C), where it measured faster (bench/topk_pools.py; both faster than
    torch.topk over the row)."""
    n, p = scores.shape
    if scores.dtype != torch.float32 or not 0 < k <= p:
        raise ValueError(f"top_pools: scores must be float32 [n, P >= k], got {scores.dtype} {tuple(scores.shape)}, k={k}")
    out = torch.empty(n, k, dtype=torch.long, device=scores.device)
    if not n:
        return out
    c = max(2 * triton.next_power_of_2(k), min(1024, triton.next_power_of_2(p)))
    scores, positions = scores.contiguous(), positions.contiguous()
    nch = triton.cdiv(p, c)
    if chunked is None:
        chunked = nch > 1
    if not chunked:
        _top_pools_kernel[(n,)](scores, positions, out, p, K=k, KPOOL=kpool, C=c, num_warps=4)
        return out
    part = torch.empty(n, nch, k, dtype=torch.long, device=scores.device)
    _top_pools_chunk_kernel[(n, nch)](scores, positions, part, p, nch, K=k, KPOOL=kpool, C=c, num_warps=4)
    _top_pools_merge_kernel[(n,)](part, positions, out, p, nch, K=k, KPOOL=kpool, C=c,
                                  M=triton.next_power_of_2(nch * k), num_warps=4)
    return out
