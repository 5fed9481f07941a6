"""Steps replayed from CUDA graphs: decode steps, and with speculative decoding the verify steps, the
KDA commit and the MTP draft steps.

A graph is captured per key (kind, b, q): b sequences (a padded batch size, "bucket") of q rows each.
Decode steps are ("main", b, 1) for every bucket up to --max-num-seqs. With the MTP drafter, buckets up
to SPEC_MAX_BATCH also get ("main", b, q) verify steps for q = 2 .. 1+k (a sequence with fewer drafts, or
none, is padded to q rows), ("commit", b, q) for the KDA commit after each, and ("draft", b, q) for the
MTP layer (catch-up over up to q positions, then one position per chained depth; with MTP index sharing
a chained depth is ("reuse", b, 1), its selection rows an input). With the draft chain
(`--draft-graph chain`, and fused) ("chain", b, q) graphs run a catch-up of q rows per sequence and then
k-1 more depths in one replay: each depth's greedy draft (the argmax, on the device) is the next depth's
input token at the next position, its cache row looked up in the block table inside the graph, so a
drafting step costs one replay and one host copy instead of one of each per depth.
With `--draft-graph fused` (the chain's graphs, and more) a ("spec", b, 1+k) graph follows the verify graph
("main", b, 1+k) with no host step between them: the greedy acceptance on the device (each row's argmax
against the next row's draft), the KDA commit of the accepted rows, the MTP catch-up over the verify rows
(the main model's hidden rows and each row's argmax as the next token; rows past the accepted run are
drafts never used, as in a verify step) and the chained depths from the last accepted row; one host copy
of the argmaxes, accepted counts and drafts ends the step (`spec_step`).

All inputs of a step live in one persistent int64 device buffer, filled from a pinned host twin with
one non-blocking copy per step. Layout for key (b, q), T = b*q rows: token ids, positions, cache rows
(slot mapping), owning block-table row of each row [T each]; KDA slots [b]; block tables [b+1, W] whose
last row is all dummy block; then, read outside the graph, the padded row of each wanted logits row, of
each real row, and the MTP's source hidden rows. Padding rows (past a sequence's real rows, or of
padding sequences) own the dummy table row: token 0 at position 0, so every cache write of theirs lands
in the reserved dummy block; padding sequences use the dummy KDA slot. A padded verify row is a draft
that is never accepted: its logits are not read and the commit never replays it. The block tables have
a fixed width (the longest sequence the cache can hold), so the indexer and attention see fixed shapes.
Without CUDA (`capture=False`), the same padded steps run eagerly: the padding is testable on CPU.
"""

from __future__ import annotations

import logging
import time

import numpy as np
import torch

from tpserve.model.batch import ForwardBatch
from tpserve.model.indexer import selection_width
from tpserve.model.kda import commit_uniform

log = logging.getLogger("tpserve.graphs")

SPEC_MAX_BATCH = 16  # verify / commit / draft graphs for batches up to this (speculation pays at small ones)


def buckets(max_num_seqs: int) -> list[int]:
    """1, 2, 4, 8, then steps of 8 up to 64 and of 16 beyond, ending at max_num_seqs."""
    out = [b for b in (1, 2, 4, 8) if b < max_num_seqs]
    b = 16
    while b < max_num_seqs:
        out.append(b)
        b += 8 if b < 64 else 16
    return out + [max_num_seqs]


class StepGraphs:
    def __init__(self, runner, max_num_seqs: int, max_blocks: int, capture: bool = True, max_query: int = 1,
                 chain: bool = False, fused: bool = False):
        self.runner, self.capture, self.max_blocks = runner, capture, max_blocks
        self.buckets = buckets(max_num_seqs)
        self.max_bs = self.buckets[-1]
        self.max_q = max_query
        self.spec_buckets = [b for b in self.buckets if b <= SPEC_MAX_BATCH] if max_query > 1 or runner.mtp else []
        if self.spec_buckets and self.spec_buckets[-1] < min(max_num_seqs, SPEC_MAX_BATCH):
            self.spec_buckets.append(min(max_num_seqs, SPEC_MAX_BATCH))
        # chain graphs draft max_query - 1 depths (num_speculative_tokens); none for one depth
        self.chain_depths = max_query - 1 if chain and runner.mtp and max_query >= 3 and self.spec_buckets else 0
        self.fused = fused and self.chain_depths > 0  # ("spec", b, max_query) graphs after the verify graphs
        shape = runner.cache_shape
        self.dummy_slot, self.dummy_block, self.block_size = shape.num_slots, shape.num_blocks, shape.block_size
        dev = runner.device
        width = max(self._width(b, q) for b, q in [(self.max_bs, 1)] + [(b, max_query) for b in self.spec_buckets])
        self.counts_at = width
        self.device_buf = torch.zeros(width + self.max_bs, dtype=torch.long, device=dev)
        self.host_buf = torch.zeros(width + self.max_bs, dtype=torch.long, pin_memory=dev.type == "cuda")
        self.host_np = self.host_buf.numpy()
        rows = max(self.max_bs, max(self.spec_buckets, default=0) * max_query)
        self.arange = torch.arange(rows, dtype=torch.long, device=dev)
        self.hidden_in = None  # the MTP draft graphs' hidden rows (input)
        self.selection_in = None  # ... and, with MTP index sharing, the selection rows of ("reuse", b, 1) graphs
        self.share = bool(runner.mtp) and runner.model.mtp.share_selection
        if self.spec_buckets and runner.mtp:
            self.hidden_in = torch.zeros(rows, runner.cfg.hidden_size, dtype=runner.ctx.dtype, device=dev)
            if self.share:
                self.selection_in = torch.zeros(rows, selection_width(runner.cfg), dtype=torch.long, device=dev)
        self.copied = torch.cuda.Event() if dev.type == "cuda" else None  # the host twin may be rewritten
        self._tables_layout, self._tables_cache = None, []  # the block-table rows last written (`_fill_tables`)
        self._view_cache: dict[tuple[bool, int, int], tuple] = {}  # (host?, b, q) -> `_views`
        self._padding: dict[tuple[int, int], np.ndarray] = {}  # (b, q) -> ids .. slots of an all-padding step
        self.graphs: dict[tuple[str, int, int], tuple[torch.cuda.CUDAGraph | None, tuple]] = {}
        self.verify: dict[tuple[int, int], dict] = {}  # (b, q) -> the verify graph's KDA rows (model/kda.py)
        self.verify_out: dict[tuple[int, int], tuple] = {}  # (b, q) -> the verify graph's (logits, hidden)
        self.pool = None
        self.capture_seconds = 0.0
        self.graph_bytes = 0

    # ------------------------------------------------------------------ layout
    def _width(self, b: int, q: int) -> int:
        t = b * q
        return 4 * t + b + (b + 1) * self.max_blocks + 3 * t

    def _views(self, buf, b: int, q: int):
        """-> ids, positions, cache rows, owner rows [T]; slots [b]; tables [b+1, W]; then the host-side
        index fields (padded logits rows, padded real rows, MTP source rows), [T] each. Made once per buffer
        and layout (a dozen numpy slices)."""
        key = (buf is self.host_np, b, q)
        views = self._view_cache.get(key)
        if views is None:
            views = self._view_cache[key] = self._make_views(buf, b, q)
        return views

    def _make_views(self, buf, b: int, q: int):
        t, w = b * q, self.max_blocks
        ids, pos, rows, owner = (buf[i * t:(i + 1) * t] for i in range(4))
        slots = buf[4 * t:4 * t + b]
        o = 4 * t + b
        tables = buf[o:o + (b + 1) * w].reshape(b + 1, w)
        o += (b + 1) * w
        lrows, real, src = (buf[o + i * t:o + (i + 1) * t] for i in range(3))
        return ids, pos, rows, owner, slots, tables, lrows, real, src

    def _batch(self, b: int, q: int) -> ForwardBatch:
        ids, pos, rows, owner, slots, tables, *_ = self._views(self.device_buf, b, q)
        return ForwardBatch(input_ids=ids, positions=pos, cu_seqlens=list(range(0, b * q + 1, q)), context_lens=[0] * b,
                            slots=slots, block_tables=tables, slot_mapping=rows, logits_indices=self.arange[:b * q],
                            token_seq=owner, decode_seqs=b, fixed_shapes=True, query_len=q)

    def _wait_host(self) -> None:
        if self.copied is not None:
            self.copied.synchronize()  # the last step's copy has read the host twin

    def _copy(self, start: int, end: int) -> None:
        self.device_buf[start:end].copy_(self.host_buf[start:end], non_blocking=True)
        if self.copied is not None:
            self.copied.record()

    def _fill(self, plan, b: int, q: int, source_rows: list[int] | None = None) -> tuple[int, int]:
        """Write a plan (or only padding, plan None) into the host twin, then one copy to the device.
        -> (real rows, wanted logits rows)."""
        self._wait_host()
        ids, pos, rows, owner, slots, tables, lrows, real, src = self._views(self.host_np, b, q)
        n = 0 if plan is None else len(plan.slots)
        bs = self.block_size
        padding = self._padding.get((b, q))
        if padding is None:  # ids 0, positions 0, the dummy block's first row, owner the dummy row b, dummy slots
            padding = self._padding[(b, q)] = np.concatenate([
                np.zeros(2 * b * q, np.int64), np.full(b * q, self.dummy_block * bs), np.full(b * q, b),
                np.full(b, self.dummy_slot)])
        self.host_np[:len(padding)] = padding  # (the fields' order in the buffer: `_views`)
        self._fill_tables(tables, (b, q), [] if plan is None else plan.block_tables)
        if plan is None or source_rows is not None:  # a chain graph (captured, or an MTP step) reads one logits
            lrows[:b] = np.arange(b) * q  # row per sequence: padding sequences their first
        n_real = n_logits = 0
        if n:
            slots[:n] = plan.slots
        if n and q == 1:  # decode: one row per sequence
            ids[:n], pos[:n], owner[:n] = plan.input_ids, plan.positions, np.arange(n)
            if n > 8:  # (array ops cost more than a loop for a few sequences)
                p = pos[:n]
                rows[:n] = tables[np.arange(n), p // bs] * bs + p % bs
            else:
                for i, (t, p) in enumerate(zip(plan.block_tables, plan.positions)):
                    rows[i] = t[p // bs] * bs + p % bs
            if source_rows is not None:  # an MTP depth: rows are their own padded rows
                real[:n] = np.arange(n)
            if plan.prev_rows is not None:  # async scheduling: where each row's id is in the in-flight tokens
                src[:n] = plan.prev_rows
        elif n > 2:  # verify rows, as array expressions (a loop costs ~6 numpy calls per sequence)
            cu = np.asarray(plan.cu_seqlens)
            lengths = np.diff(cu)
            seq_of_row = np.repeat(np.arange(n), lengths)
            dst = np.arange(cu[-1]) + (seq_of_row * q - cu[seq_of_row])  # each sequence's rows from i * q
            p = np.asarray(plan.positions)
            ids[dst], pos[dst], owner[dst] = plan.input_ids, p, seq_of_row
            rows[dst] = tables[seq_of_row, p // bs] * bs + p % bs
            real[:cu[-1]] = dst
        elif n:
            cu = plan.cu_seqlens
            for i, t in enumerate(plan.block_tables):
                a, e = cu[i], cu[i + 1]
                r = slice(i * q, i * q + e - a)
                ids[r] = plan.input_ids[a:e]
                p = np.asarray(plan.positions[a:e])
                pos[r] = p
                owner[r] = i
                rows[r] = np.asarray(t)[p // bs] * bs + p % bs
                real[a:e] = np.arange(i * q, i * q + e - a)
        if n:
            n_real, n_logits = plan.cu_seqlens[-1], len(plan.logits_indices)
            if q > 1 or source_rows is not None:  # the index fields are read by verify and draft steps only
                lrows[:n_logits] = real[plan.logits_indices]
            if source_rows is not None:
                src[:len(source_rows)] = source_rows
        self._copy(0, self._width(b, q))
        return n_real, n_logits

    def _fill_tables(self, tables: np.ndarray, layout: tuple[int, int], block_tables: list[list[int]]) -> None:
        """The block tables into their host rows (padding rows: the dummy block), rewriting only rows that
        changed since the last fill of the same layout (b, q): a sequence's table changes only when it gains a
        block, and writing a row costs more than comparing it (~64 rows per step at batch 64). Another layout
        overlaps these host rows with other fields, so a fill of another layout rewrites every row."""
        cached = self._tables_cache if self._tables_layout == layout else [None] * tables.shape[0]
        for i in range(tables.shape[0]):
            t = block_tables[i] if i < len(block_tables) else ()
            if cached[i] == t:
                continue
            tables[i, :len(t)] = t
            tables[i, len(t):] = self.dummy_block
            cached[i] = t
        self._tables_layout, self._tables_cache = layout, cached

    def _fields(self, b: int, q: int, n_real: int, n_logits: int):
        *_, lrows, real, src = self._views(self.device_buf, b, q)
        return lrows[:n_logits], real[:n_real], src[:n_real]

    # ----------------------------------------------------------------- capture
    def _forward(self, kind: str, b: int, q: int):
        model, cache = self.runner.model, self.runner.cache
        batch = self._batch(b, q)
        if kind == "main":
            return model.forward_hidden(batch, cache)
        if kind == "commit":
            commit_uniform(cache, self.verify[(b, q)], self.device_buf[self.counts_at:self.counts_at + b])
            return ()
        if kind == "spec":
            return self._spec(batch, b, q)
        hidden = self.hidden_in[:b * q]
        reuse = self.selection_in[:b] if kind == "reuse" else None
        if kind == "chain":  # one logits row per sequence, from the host
            lrows = self._views(self.device_buf, b, q)[6][:b]
            out, selection = model.mtp.draft(hidden, model.embed(batch.input_ids, batch), batch, cache, reuse,
                                             keep=lrows)
            return self._chain(batch, b, out, lrows, selection=selection)
        out, selection = model.mtp.draft(hidden, model.embed(batch.input_ids, batch), batch, cache, reuse)
        logits = model.lm_logits(out)
        return out, logits, self.runner.ops.argmax_probability(logits), selection

    def _spec(self, batch: ForwardBatch, b: int, q: int) -> torch.Tensor:
        """After the verify graph (b, q) (its logits and hidden rows; each sequence's last token and up to q-1
        drafts, padded to q rows): greedy acceptance, the KDA commit of 1 + accepted rows, the MTP catch-up over
        the verify rows and the chain from each sequence's last accepted row. -> float64 [b*q argmaxes | b
        accepted counts | 2 * depths * b draws (argmax_and_probability of each depth)], for one host copy."""
        model, cache = self.runner.model, self.runner.cache
        logits, hidden = self.verify_out[(b, q)]
        greedy = logits.argmax(-1).view(b, q)
        real = batch.token_seq.view(b, q) == self.arange[:b].unsqueeze(1)  # padding rows own the dummy table row
        hit = (greedy[:, :-1] == batch.input_ids.view(b, q)[:, 1:]) & real[:, 1:]  # row j's choice vs draft j+1
        accepted = hit.long().cumprod(1).sum(1)
        commit_uniform(cache, self.verify[(b, q)], accepted + 1)
        # catch-up: the token after row j's position is row j's argmax (a draft accepted there, or the bonus)
        lrows = self.arange[:b] * q + accepted
        out, selection = model.mtp.draft(hidden, model.embed(greedy.view(-1), batch), batch, cache, keep=lrows)
        packed = torch.empty(b * q + b + 2 * self.chain_depths * b, dtype=torch.float64, device=greedy.device)
        packed[:b * q] = greedy.view(-1)
        packed[b * q:b * q + b] = accepted
        self._chain(batch, b, out, lrows, packed[b * q + b:].view(2, self.chain_depths, b), selection)
        return packed

    def _chain(self, batch: ForwardBatch, b: int, hidden: torch.Tensor, lrows: torch.Tensor,
               draws: torch.Tensor | None = None, selection: torch.Tensor | None = None) -> torch.Tensor:
        """The chained depths after a catch-up (its MTP output at rows lrows, b rows: the LM head's input and
        the next depth's hidden; `selection`: its selection rows, b*q): each sequence's row lrows[i] gives its draft,
        which the next depth reads at the next position (with index sharing, over row lrows[i]'s selection).
        The same forms and shapes as the per-depth draft graphs ("draft" / "reuse", b, 1). -> greedy
        [2, depths, b] (written into `draws` when given)."""
        model, cache, bs, depths = self.runner.model, self.runner.cache, self.block_size, self.chain_depths
        if draws is None:
            draws = torch.empty(2, depths, b, dtype=torch.float64, device=hidden.device)
        seqs = self.arange[:b]
        pos = batch.positions.index_select(0, lrows)
        reuse = selection.index_select(0, lrows) if self.share else None
        self._draw(model.lm_logits(hidden), draws[:, 0])
        if depths > 1:  # every later depth's positions and cache rows at once [depths - 1, b]
            ahead = pos.unsqueeze(0) + self.arange[1:depths].unsqueeze(1)
            rows = batch.block_tables[seqs, ahead // bs] * bs + ahead % bs
        for d in range(1, depths):
            ids = draws[0, d - 1].long()
            step = ForwardBatch(input_ids=ids, positions=ahead[d - 1], cu_seqlens=list(range(b + 1)),
                                context_lens=[0] * b, slots=batch.slots, block_tables=batch.block_tables,
                                slot_mapping=rows[d - 1], logits_indices=seqs, token_seq=seqs, decode_seqs=b,
                                fixed_shapes=True, query_len=1)
            hidden, _ = model.mtp.draft(hidden, model.embed(ids, step), step, cache, reuse)
            self._draw(model.lm_logits(hidden), draws[:, d])
        return draws

    def _draw(self, logits: torch.Tensor, out: torch.Tensor) -> None:
        """argmax_and_probability of logits [n, V] into out (a float64 [2, n] view)."""
        self.runner.ops.argmax_probability(logits, out)

    def _capture_one(self, kind: str, b: int, q: int) -> None:
        cache = self.runner.cache
        self._fill(None, b, q)
        self._forward(kind, b, q)  # warm-up: Triton autotuning and lazy init outside capture
        cache.verify.clear()
        torch.cuda.synchronize(self.runner.device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = self._forward(kind, b, q)
        if self.pool is None:
            self.pool = graph.pool()
        self.graphs[(kind, b, q)] = (graph, out)
        if kind == "main" and q > 1:  # the captured verify rows and outputs stay alive: commit, spec read them
            self.verify[(b, q)] = dict(cache.verify)
            self.verify_out[(b, q)] = out
            cache.verify.clear()

    def keys(self) -> list[tuple[str, int, int]]:
        out = [("main", b, 1) for b in reversed(self.buckets)]  # largest first: the smaller ones reuse its pool
        for q in range(2, self.max_q + 1):
            for b in reversed(self.spec_buckets):
                out += [("main", b, q), ("commit", b, q)]
        if self.runner.mtp:
            out += [("draft", b, q) for q in range(1, self.max_q + 1) for b in reversed(self.spec_buckets)]
            if self.share:
                out += [("reuse", b, 1) for b in reversed(self.spec_buckets)]
        if self.chain_depths:
            out += [("chain", b, q) for q in range(1, self.max_q + 1) for b in reversed(self.spec_buckets)]
        if self.fused:
            out += [("spec", b, self.max_q) for b in reversed(self.spec_buckets)]
        return out

    def capture_all(self) -> None:
        if not self.capture:
            return
        reserved_before = torch.cuda.memory_reserved(self.runner.device)
        start = time.perf_counter()
        try:
            for key in self.keys():
                self._capture_one(*key)
        except torch.OutOfMemoryError as exc:
            self.close()
            raise RuntimeError(f"out of GPU memory while capturing decode graphs ({exc}); lower --max-num-seqs "
                               "or --gpu-memory-utilization, or pass --enforce-eager") from exc
        except Exception as exc:  # a capture that fails falls back to eager, with the reason
            log.warning("graph capture failed, running eagerly: %s: %s", type(exc).__name__, exc)
            self.close()
            self.capture = False
            self.spec_buckets = []
            self.chain_depths = 0
            self.fused = False
            return
        torch.cuda.synchronize(self.runner.device)
        self.capture_seconds = time.perf_counter() - start
        self.graph_bytes = torch.cuda.memory_reserved(self.runner.device) - reserved_before
        log.info("captured %d graphs (decode batch %s; verify/commit/draft%s batch %s, up to %d rows each) in %.1f s, "
                 "%.0f MiB of graph memory", len(self.graphs), ",".join(map(str, self.buckets)),
                 "/chain/spec" if self.fused else "/chain" if self.chain_depths else "",
                 ",".join(map(str, self.spec_buckets)) or "-", self.max_q,
                 self.capture_seconds,
                 self.graph_bytes / 2**20)

    # -------------------------------------------------------------------- step
    def key_for(self, plan, kind: str = "main") -> tuple[str, int, int] | None:
        """The graph that runs this plan (decode / verify sequences only), or None (eager)."""
        n = len(plan.slots)
        if n == 0 or plan.num_decode != n or plan.sequence_parallel:
            return None
        if max(len(t) for t in plan.block_tables) > self.max_blocks:
            return None
        q = max(b - a for a, b in zip(plan.cu_seqlens, plan.cu_seqlens[1:]))
        if kind == "main" and q == 1:
            return (kind, self.bucket(n), 1) if n <= self.max_bs else None
        if q > self.max_q or not self.spec_buckets or n > self.spec_buckets[-1]:
            return None
        return kind, next(b for b in self.spec_buckets if b >= n), q

    def bucket(self, n: int) -> int:
        return next(b for b in self.buckets if b >= n)

    def _replay(self, key):
        if self.capture:
            graph, out = self.graphs[key]
            graph.replay()
            return out
        out = self._forward(*key)
        if key[0] == "main" and key[2] > 1:  # eager: the verify rows are this run's (commit, spec read them)
            self.verify[key[1:]] = dict(self.runner.cache.verify)
            self.verify_out[key[1:]] = out
            self.runner.cache.verify.clear()
        return out

    def run(self, plan, key, prev: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (logits at plan.logits_indices, hidden of the plan's rows in plan order). prev (a decode plan
        with prev_rows, async scheduling): the in-flight step's tokens, gathered into the ids on the device."""
        _, b, q = key
        n_real, n_logits = self._fill(plan, b, q)
        if prev is not None:
            if q != 1:
                raise ValueError("graphs.run: only decode steps take their ids from the in-flight tokens")
            ids, *_, src = self._views(self.device_buf, b, q)
            torch.index_select(prev, 0, src[:n_real], out=ids[:n_real])
        logits, hidden = self._replay(key)
        if q == 1:
            return logits[:n_logits], hidden[:n_real]
        lrows, real, _ = self._fields(b, q, n_real, n_logits)
        return logits.index_select(0, lrows), hidden.index_select(0, real)

    def commit(self, key, counts: list[int]) -> None:
        """The KDA commit after verify graph `key`: counts of every sequence of that step, in order."""
        _, b, q = key
        self._wait_host()
        self.host_np[self.counts_at:self.counts_at + b] = 0
        self.host_np[self.counts_at:self.counts_at + len(counts)] = counts
        self._copy(self.counts_at, self.counts_at + b)
        self._replay(("commit", b, q))

    def draft(self, plan, key, source: torch.Tensor, source_rows: list[int], selection: torch.Tensor | None = None):
        """One MTP depth: hidden inputs source[source_rows] for the plan's rows (and, for a ("reuse", b, 1) key,
        selection rows selection[source_rows]) -> (fp32 logits at plan.logits_indices, the MTP hidden rows
        there, their argmax_and_probability [2, n], their selection rows with index sharing, else None)."""
        _, b, q = key
        n_real, n_logits = self._fill(plan, b, q, source_rows)
        lrows, real, src = self._fields(b, q, n_real, n_logits)
        self.hidden_in.index_copy_(0, real, source.index_select(0, src))
        if key[0] == "reuse":
            self.selection_in.index_copy_(0, real, selection.index_select(0, src))
        new_hidden, logits, greedy, used = self._replay(key)
        return (logits.index_select(0, lrows), new_hidden.index_select(0, lrows), greedy.index_select(1, lrows),
                used.index_select(0, lrows) if self.share else None)

    def draft_chain(self, plan, key, source: torch.Tensor, source_rows: list[int]) -> torch.Tensor:
        """The catch-up `plan` (one logits row per sequence) and chain_depths - 1 more depths -> greedy draws
        [2, depths, sequences]."""
        _, b, q = key
        n_real, n_logits = self._fill(plan, b, q, source_rows)
        _, real, src = self._fields(b, q, n_real, n_logits)
        self.hidden_in.index_copy_(0, real, source.index_select(0, src))
        return self._replay(key)[:, :, :len(plan.slots)]

    def spec_step(self, plan, key, while_waiting=None) -> tuple[list[list[int]], list[int], list]:
        """A verify step (key ("main", b, max_q): every sequence verifies up to max_q - 1 drafts, padded to max_q
        rows) and the ("spec", b, max_q) graph after it, no host step between -> for the plan's n sequences,
        from one host copy: the argmax of each verify row [n][q] (padding rows' too), the accepted drafts [n],
        the chain's draws [2][depths][n]. while_waiting: host work run once both replays are launched."""
        _, b, q = key
        n = len(plan.slots)
        self._fill(plan, b, q)
        self._replay(key)
        out = self._replay(("spec", b, q))
        if while_waiting is not None:
            while_waiting()
        packed = out.cpu().numpy()  # the step's one device-to-host copy
        greedy = packed[:b * q].reshape(b, q)[:n].astype(np.int64).tolist()
        accepted = packed[b * q:b * q + n].astype(np.int64).tolist()
        draws = packed[b * q + b:].reshape(2, self.chain_depths, b)[:, :, :n].tolist()
        return greedy, accepted, draws

    def close(self) -> None:
        self.graphs.clear()
        self.verify.clear()
        self.verify_out.clear()
        self.pool = None
