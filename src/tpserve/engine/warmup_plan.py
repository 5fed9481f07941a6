"""The warm-up's steps (engine/warmup.py runs them): which shapes each kernel phase covers.

Triton builds a kernel per value of each constexpr (tile sizes some wrappers derive from a row count, a pool count or
a context length), per integer argument equal to 1 or a multiple of 16, and tunes per autotune key. Phases:
  prefill   one sequence from position 0: 1-16 tokens one by one (GEMV rows), then in each power-of-two class a
            multiple of 16 and another count up to --max-num-batched-tokens; the triton / grouped MoE and the
            sequence-parallel boundaries
  batch     several prefill chunks in one step (varlen KDA kernels by sequence count)
  chunked   chunks after a context (chunked prefill)
  sparse    chunks on the sparse MLA prefill path, every length below ROW_SWEEP (the kernel splits each token's
            selection by the chunk's length) and a full one, each alone and after a decode row (Triton specializes
            pointers on 16-byte alignment: the chunk's rows of the selection then start at an odd row)
  mixed     decode rows (verify rows with speculation) beside a prefill chunk, every count below ROW_SWEEP
  contexts  a decode row beside a prefill chunk at each pool count up to the indexer's top-k pools (its top-k kernel
            is built per tile, which follows the count), then at powers of two and one past them
  decode    one step per captured graph bucket, or every batch size when steps run eagerly
With prefix caching, each step's first prefill chunk of two or more rows also keeps a state checkpoint inside it
(ForwardBatch.state_saves: the KDA recurrence over its rows but the last), as requests' chunks do.
On a CPU nothing compiles: each phase runs one step (its largest, at small sizes).
"""

from __future__ import annotations

from dataclasses import dataclass

from tpserve.engine.graphs import buckets
from tpserve.model.mla import SPARSE_PREFILL_FROM

ROW_SWEEP = 264   # rows below which the sparse MLA splits its work by the count (kernels/mla_triton.FULL_GRID)
CPU_TOKENS = 4    # a CPU warm-up's largest chunk
CPU_SEQS = 2

Seq = tuple[int, int, bool]  # (context, rows, decode) of one sequence in a step


@dataclass(frozen=True)
class Limits:
    budget: int                # --max-num-batched-tokens
    max_seqs: int
    max_len: int               # max_model_len
    moe_max: int               # --moe-triton-max-tokens
    sp_min: int | None         # sequence parallelism from this many tokens (TP > 1), else None
    kpool: int
    keep: int                  # pools the indexer keeps (index_topk / index_kpool)
    sparse_from: int | None    # positions from which a prefill chunk takes sparse MLA; None: never
    spec_k: int                # num_speculative_tokens (0: no speculation)
    graph_buckets: tuple[int, ...] | None  # decode batches replayed from graphs; None: eager steps
    full: bool                 # every class (CUDA), or one step a phase (CPU)


def limits(engine) -> Limits:
    e, cfg = engine.ecfg, engine.model_config
    full = engine.device.type == "cuda"
    mode = e.mla_prefill
    sparse = None if not cfg.mla_layers or mode == "dense" else 0 if mode == "sparse" else SPARSE_PREFILL_FROM
    if sparse is not None and sparse > engine.max_model_len:
        sparse = None
    spec = e.speculative
    graphs = engine.executor.verify_graph_batch() is not None  # (None: no step replays a graph)
    return Limits(e.max_num_batched_tokens if full else min(e.max_num_batched_tokens, CPU_TOKENS),
                  e.max_num_seqs if full else min(e.max_num_seqs, CPU_SEQS), engine.max_model_len,
                  e.moe_triton_max_tokens, e.sp_min_tokens if e.sequence_parallel and e.tensor_parallel_size > 1
                  else None, cfg.index_kpool, max(cfg.index_topk // cfg.index_kpool, 1), sparse,
                  0 if spec is None else spec.num_speculative_tokens,
                  tuple(buckets(e.max_num_seqs)) if graphs else None, full)


def token_sizes(lim: Limits) -> list[int]:
    """Prefill token counts: 1-16, then a multiple of 16 and another count per power-of-two class, the limits."""
    b = lim.budget
    sizes = set(range(1, 17))
    p = 32
    while p // 2 < b:
        sizes.update((p - 8, p))
        p *= 2
    sizes.update((b, b - 1, b // 16 * 16, lim.moe_max, lim.moe_max + 1))
    if lim.sp_min:
        sizes.update((lim.sp_min - 1, lim.sp_min))
    return sorted(t for t in sizes if 1 <= t <= b)


def _decode_rows(rows: int, lim: Limits, ctx: int) -> list[Seq]:
    """`rows` decode rows: one per sequence, or (more rows than sequences, with speculation) verify rows."""
    if rows <= lim.max_seqs:
        return [(ctx, 1, True)] * rows
    per, extra = divmod(rows, lim.max_seqs)
    return [(ctx, per, True)] * (lim.max_seqs - extra) + [(ctx, per + 1, True)] * extra


def plan(lim: Limits) -> dict[str, list[list[Seq]]]:
    """The kernel phases' steps, each a list of sequences (decode ones first, as the engine orders them)."""
    b, kp = lim.budget, lim.kpool
    deep = max(min(lim.keep * kp, lim.max_len - 2 - lim.spec_k), 0)  # decode rows' context: the whole top-k kept
    steps: dict[str, list[list[Seq]]] = {"prefill": [[(0, t, False)] for t in token_sizes(lim)]}
    steps["batch"] = [[(0, max(1, min(24, b // n)), False)] * n for n in sorted({2, 16, lim.max_seqs})
                      if 2 <= n <= min(lim.max_seqs, b)]
    steps["chunked"] = [[(min(b, lim.max_len - t), t, False)] for t in sorted({min(7, b), b}) if t < lim.max_len]
    steps["sparse"] = []
    if lim.sparse_from is not None:
        for t in sorted(set(range(1, min(ROW_SWEEP, b) + 1)) | {b}):
            chunk = (max(lim.sparse_from - t, 0), t, False)
            if t <= lim.max_len:  # alone, and after a decode row (its rows from an odd offset: another alignment)
                steps["sparse"] += [[chunk]] + ([[(deep, 1, True), chunk]] if t < b else [])
    rows = min(lim.max_seqs * (1 + lim.spec_k), ROW_SWEEP, b - 1)
    steps["mixed"] = [_decode_rows(r, lim, deep) + [(0, min(5, b - r), False)] for r in range(1, rows + 1)]
    pools = list(range(lim.keep + 1))
    p = 1 << lim.keep.bit_length()
    while p * kp <= lim.max_len:
        pools += [p, p + 1]
        p *= 2
    steps["contexts"] = [[(max(n * kp - 1, 0), 1, True), (0, 1, False)] for n in pools if n * kp <= lim.max_len]
    sizes = lim.graph_buckets or range(1, lim.max_seqs + 1)
    steps["decode"] = [[(deep, 1, True)] * n for n in sizes if n <= lim.max_seqs]
    if not lim.full:  # the code paths only: each phase's last (largest) step
        steps = {name: s[-1:] for name, s in steps.items()}
    return steps
