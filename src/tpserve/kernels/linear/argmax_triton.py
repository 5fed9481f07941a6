"""The MTP drafter's greedy draw per row in one Triton kernel (switch `--argmax-backend`): each row's argmax
(the first index on ties, as torch.argmax) and its probability under the softmax, 1 / sum(exp(x - max)).

The torch form (linear/ref.py `argmax_and_probability`: max, logsumexp, sub, exp, two casts, stack) is
~9 launches per call, and a speculative step makes one call per drafted depth (3 per step at k = 3) inside
its graphs. Here one program per row walks the row once in blocks, keeping the running maximum, its first
index and the sum of exp(x - running max) rescaled as the maximum grows (online softmax). Floors: reads the
row once (GLM-5.3-Flash's 154,880 logits: 620 KB; one program per row walks it at one SM's pace), so what
it saves is launches. The probability is computed as
1 / sum instead of exp(max - logsumexp): the two differ by fp32 rounding (a few ulps), nothing a draft's
truncation threshold or calibration can see.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _argmax_prob_kernel(x_ptr, stride, out_ptr, out_stride, V, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    base = x_ptr + row.to(tl.int64) * stride
    offs = tl.arange(0, BLOCK)
    best = tl.max(tl.full([BLOCK], float("-inf"), tl.float32), axis=0)
    where = tl.min(tl.zeros([BLOCK], tl.int64), axis=0)
    total = tl.sum(tl.zeros([BLOCK], tl.float32), axis=0)
    for start in range(0, V, BLOCK):
        col = start + offs
        x = tl.load(base + col, mask=col < V, other=float("-inf")).to(tl.float32)
        block_max = tl.max(x, axis=0)
        block_at = tl.min(tl.where(x == block_max, col, V), axis=0).to(tl.int64)
        new = tl.maximum(best, block_max)
        total = total * tl.exp(best - new) + tl.sum(tl.exp(x - new), axis=0)
        where = tl.where(block_max > best, block_at, where)  # strictly greater: the first block keeps ties
        best = new
    tl.store(out_ptr + row, where.to(tl.float64))
    tl.store(out_ptr + out_stride + row, (1.0 / total).to(tl.float64))


def argmax_and_probability_triton(logits: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Same contract as engine/sampler.py's argmax_and_probability: [N, V] logits (unit-stride rows) ->
    float64 [2, N] (each row's argmax, then its probability), written into `out` when given (a [2, N]
    float64 view whose rows have unit stride: a slice of a larger output)."""
    if logits.dim() != 2 or logits.stride(1) != 1:
        raise ValueError(f"argmax_and_probability_triton: logits {tuple(logits.shape)} must be 2-D with "
                         "unit-stride rows")
    n, v = logits.shape
    if out is None:
        out = torch.empty(2, n, dtype=torch.float64, device=logits.device)
    elif out.shape != (2, n) or out.dtype != torch.float64 or out.stride(1) != 1:
        raise ValueError(f"argmax_and_probability_triton: out must be float64 [2, {n}] with unit-stride rows")
    if n:
        block = min(4096, triton.next_power_of_2(max(v, 16)))
        _argmax_prob_kernel[(n,)](logits, logits.stride(0), out, out.stride(0), v, BLOCK=block, num_warps=8)
    return out
