"""Decode steps replayed from CUDA graphs, one per padded batch size (bucket).

All inputs of a decode step live in one persistent int64 device buffer (views: token ids,
positions, KDA slots, cache rows, block tables), filled from a pinned host twin with one
non-blocking copy per step. A step of B sequences runs the graph of the smallest bucket >= B;
rows past B are padding: token 0 at position 0, the reserved dummy KDA slot and dummy cache block,
so their writes land nowhere that matters and their logits are never read. The block tables
have a fixed width (the longest sequence the cache can hold), so the indexer and attention see
fixed shapes. Without CUDA (`capture=False`), the same padded steps run eagerly: the padding is
then testable on CPU.
"""

from __future__ import annotations

import logging
import time

import numpy as np
import torch

from tpserve.model.batch import ForwardBatch

log = logging.getLogger("tpserve.graphs")


def buckets(max_num_seqs: int) -> list[int]:
    """1, 2, 4, 8, then steps of 8 up to 64 and of 16 beyond, ending at max_num_seqs."""
    out = [b for b in (1, 2, 4, 8) if b < max_num_seqs]
    b = 16
    while b < max_num_seqs:
        out.append(b)
        b += 8 if b < 64 else 16
    return out + [max_num_seqs]


class DecodeGraphs:
    FIELDS = 4  # ids, positions, slots, slot_mapping; then the block table

    def __init__(self, runner, max_num_seqs: int, max_blocks: int, capture: bool = True):
        self.runner, self.capture, self.max_blocks = runner, capture, max_blocks
        self.buckets = buckets(max_num_seqs)
        self.max_bs = self.buckets[-1]
        shape = runner.cache_shape
        self.dummy_slot, self.dummy_block, self.block_size = shape.num_slots, shape.num_blocks, shape.block_size
        dev = runner.device
        width = self.max_bs * (self.FIELDS + max_blocks)
        self.device_buf = torch.zeros(width, dtype=torch.long, device=dev)
        self.host_buf = torch.zeros(width, dtype=torch.long, pin_memory=dev.type == "cuda")
        self.host_np = self.host_buf.numpy()
        self.arange = torch.arange(self.max_bs, dtype=torch.long, device=dev)
        self.copied = torch.cuda.Event() if dev.type == "cuda" else None  # the host twin may be rewritten
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph | None, tuple[torch.Tensor, torch.Tensor]]] = {}
        self.pool = None
        self.capture_seconds = 0.0
        self.graph_bytes = 0

    # ------------------------------------------------------------------ layout
    def _views(self, buf: torch.Tensor | np.ndarray, b: int):
        n = self.max_bs
        ids, pos, slots, rows = (buf[i * n:i * n + b] for i in range(self.FIELDS))
        tables = buf[self.FIELDS * n:].reshape(n, self.max_blocks)[:b]
        return ids, pos, slots, rows, tables

    def _batch(self, b: int) -> ForwardBatch:
        ids, pos, slots, rows, tables = self._views(self.device_buf, b)
        return ForwardBatch(input_ids=ids, positions=pos, cu_seqlens=list(range(b + 1)), context_lens=[0] * b,
                            slots=slots, block_tables=tables, slot_mapping=rows, logits_indices=self.arange[:b],
                            token_seq=self.arange[:b], decode_seqs=b, fixed_shapes=True)

    def _fill(self, plan, b: int) -> None:
        """Write a plan (or only padding, plan None) into the host twin, then one copy to the device."""
        if self.copied is not None:
            self.copied.synchronize()  # the last step's copy has read the host twin
        ids, pos, slots, rows, tables = self._views(self.host_np, b)
        n = 0 if plan is None else len(plan.slots)
        ids[n:], pos[n:], slots[n:] = 0, 0, self.dummy_slot
        tables[n:] = self.dummy_block
        rows[n:] = self.dummy_block * self.block_size
        if n:
            ids[:n] = plan.input_ids
            pos[:n] = plan.positions
            slots[:n] = plan.slots
            tables[:n] = self.dummy_block
            bs = self.block_size
            for i, t in enumerate(plan.block_tables):
                tables[i, :len(t)] = t
                p = plan.positions[i]
                rows[i] = t[p // bs] * bs + p % bs
        n_all = self.max_bs
        # copy only what bucket b reads: each field's first b entries and b table rows
        for i in range(self.FIELDS):
            self.device_buf[i * n_all:i * n_all + b].copy_(self.host_buf[i * n_all:i * n_all + b], non_blocking=True)
        t0 = self.FIELDS * n_all
        self.device_buf[t0:t0 + b * self.max_blocks].copy_(self.host_buf[t0:t0 + b * self.max_blocks],
                                                           non_blocking=True)
        if self.copied is not None:
            self.copied.record()

    # ----------------------------------------------------------------- capture
    def capture_all(self) -> None:
        if not self.capture:
            return
        model, cache = self.runner.model, self.runner.cache
        reserved_before = torch.cuda.memory_reserved(self.runner.device)
        start = time.perf_counter()
        try:
            for b in reversed(self.buckets):  # largest first: the smaller ones reuse its pool
                self._fill(None, b)
                batch = self._batch(b)
                model.forward_hidden(batch, cache)  # warm-up: Triton autotuning and lazy init outside capture
                torch.cuda.synchronize(self.runner.device)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=self.pool):
                    out = model.forward_hidden(batch, cache)
                if self.pool is None:
                    self.pool = graph.pool()
                self.graphs[b] = (graph, out)
        except torch.OutOfMemoryError as exc:
            self.close()
            raise RuntimeError(f"out of GPU memory while capturing decode graphs ({exc}); lower --max-num-seqs "
                               "or --gpu-memory-utilization, or pass --enforce-eager") from exc
        except Exception as exc:  # a capture that fails falls back to eager, with the reason
            log.warning("decode graph capture failed, running eagerly: %s: %s", type(exc).__name__, exc)
            self.close()
            self.capture = False
            return
        torch.cuda.synchronize(self.runner.device)
        self.capture_seconds = time.perf_counter() - start
        self.graph_bytes = torch.cuda.memory_reserved(self.runner.device) - reserved_before
        log.info("captured %d decode graphs (batch %s) in %.1f s, %.0f MiB of graph memory", len(self.graphs),
                 ",".join(map(str, self.buckets)), self.capture_seconds, self.graph_bytes / 2**20)

    # -------------------------------------------------------------------- step
    def fits(self, plan) -> bool:
        return (len(plan.slots) <= self.max_bs
                and max(len(t) for t in plan.block_tables) <= self.max_blocks)

    def bucket(self, n: int) -> int:
        return next(b for b in self.buckets if b >= n)

    def run(self, plan) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (logits, hidden rows) of the plan's sequences (model.forward_hidden)."""
        n = len(plan.slots)
        b = self.bucket(n)
        self._fill(plan, b)
        if self.capture:
            graph, (logits, hidden) = self.graphs[b]
            graph.replay()
        else:
            logits, hidden = self.runner.model.forward_hidden(self._batch(b), self.runner.cache)
        return logits[:n], hidden[:n]

    def close(self) -> None:
        self.graphs.clear()
        self.pool = None
