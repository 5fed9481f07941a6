"""ModelRunner: one rank's model, cache tensors and forward step.

Rank 0 turns the scheduler's decisions into a StepPlan (plain lists, cheap to send to the other
ranks); every rank turns the same plan into a ForwardBatch on its device and runs the forward.
"""

from __future__ import annotations

import dataclasses
import time
import logging
from dataclasses import dataclass, field

import torch

from tpserve.model import cache as cache_mod
from tpserve.model.h2d import to_device
from tpserve.kernels.choice import Kernels
from tpserve.model.batch import ForwardBatch
from tpserve.model.config import ModelConfig
from tpserve.model.layers import ShardContext
from tpserve.model.build import build_model
from tpserve.model.kda import commit as kda_commit
from tpserve.model.mtp import mtp_config

log = logging.getLogger("tpserve.runner")


@dataclass(frozen=True)
class Drafted:
    """One MTP depth's output rows: fp32 logits [n, vocab] and ops.argmax_probability of
    them, float64 [2, n] (greedy draws take one host copy of it). Both None where no row wanted logits."""

    logits: torch.Tensor | None  # None from a chain of depths (greedy only)
    greedy: torch.Tensor | None


@dataclass
class StepPlan:
    input_ids: list[int]
    positions: list[int]
    cu_seqlens: list[int]
    context_lens: list[int]
    slots: list[int]
    block_tables: list[list[int]]
    logits_indices: list[int]
    reset_slots: list[int]
    sequence_parallel: bool = False
    num_decode: int = 0  # the first num_decode sequences are decodes/verifies (decode kernels)
    prev_rows: list[int] | None = None  # async scheduling: each row's input id is row prev_rows[i] of the
    # in-flight step's device tokens (input_ids holds placeholders; engine/overlap.py)
    state_copies: list[tuple[int, int]] = field(default_factory=list)  # prefix caching: KDA / conv state
    # copies (source slot, destination slot) applied in order before the forward, then reset_slots
    state_saves: list[tuple[int, int, int]] = field(default_factory=list)  # prefix caching: checkpoints kept
    # inside a prefill chunk (sequence, rows, checkpoint slot; ForwardBatch.state_saves)

    @property
    def is_uniform_decode(self) -> bool:
        """Every sequence is a one-token decode (a CUDA-graph step)."""
        return self.num_decode == len(self.slots) == len(self.input_ids) and not self.sequence_parallel


@dataclass(frozen=True)
class CacheShape:
    num_blocks: int
    num_slots: int
    block_size: int
    num_checkpoints: int = 0  # prefix caching's state checkpoints: slots after the dummy one

    @property
    def first_checkpoint(self) -> int:
        return self.num_slots + 1


class ModelRunner:
    def __init__(self, model_dir: str, cfg: ModelConfig, ctx: ShardContext, device: torch.device,
                 kernels: Kernels, progress: bool | None = None, load_format: str = "auto", mtp: bool = False):
        self.cfg, self.ctx, self.device, self.mtp = cfg, ctx, device, mtp
        self.boot_seconds: dict[str, float] = {}  # the model's start-up phases (executor.py logs them)
        self.model = build_model(model_dir, cfg, ctx, device, kernels, load_format=load_format, progress=progress,
                                 mtp=mtp, timings=self.boot_seconds)
        self.last_hidden: torch.Tensor | None = None   # speculative decoding: the last step's hidden rows
        self.draft_hidden: torch.Tensor | None = None  # ... and the last MTP depth's output rows
        self.draft_selection: torch.Tensor | None = None  # ... and their selection rows (MTP index sharing)
        self.kernels = kernels
        self.ops = self.model.ctx.ops  # what the model runs (kernels/registry.py), resolved once by build_model
        self.kda_report = f"{kernels.kda} KDA path"
        if kernels.kda == "fla":
            t0 = time.perf_counter()
            self._configure_fla()
            self.boot_seconds["self_tests"] = time.perf_counter() - t0
        self.cache = None
        self.cache_shape: CacheShape | None = None
        self.graphs = None  # engine.graphs.StepGraphs once set up
        self.graph_verify = None  # the key of the last step's verify graph, until its commit

    def _configure_fla(self) -> None:
        """Check fla-core's kernels against the torch references once, on this device and head size;
        use those that agree: the recurrent kernel for decode / verify / commit, chunk_kda (with the
        options that agree) for prefill chunks; the torch path for what does not agree."""
        from tpserve.kernels.attention.kda_fla import select_fla_options
        from tpserve.model.kda import KdaAttention

        layers = [m for m in self.model.modules() if isinstance(m, KdaAttention)]
        if not layers:
            return
        recurrent, opts, report = select_fla_options(self.cfg.linear_head_dim, self.cfg.linear_lower_bound,
                                                     self.device,
                                                     device_indices=self.kernels.kda_chunk_indices == "device")
        log.info("fla-core KDA self-test (head_dim %d): %s", self.cfg.linear_head_dim, report)
        if not recurrent:
            log.warning("fla-core KDA kernels disagree with the reference here (%s); using the torch path", report)
            self.kernels = dataclasses.replace(self.kernels, kda="torch")
        for layer in layers:
            layer.backend = "fla" if recurrent else "torch"
            layer.fla_options = opts
        self.kda_report = report

    @property
    def cache_config(self) -> ModelConfig:
        """The layers that own cache: with the MTP drafter, its MLA layer (index num_hidden_layers) too."""
        return mtp_config(self.cfg) if self.mtp else self.cfg

    def allocate_cache(self, shape: CacheShape) -> None:
        """The scheduler's blocks and slots, plus one reserved dummy block (id num_blocks) and dummy
        slot (id num_slots): padding rows of graph steps and pools no token completes write there; then
        the prefix cache's state checkpoints (ids from num_slots + 1)."""
        self.cache_shape = shape
        self.cache = cache_mod.allocate_cache(self.cache_config, num_blocks=shape.num_blocks + 1,
                                              block_size=shape.block_size,
                                              num_slots=shape.num_slots + 1 + shape.num_checkpoints,
                                              world=self.ctx.world,
                                              dtype=self.ctx.dtype, device=self.device)

    def setup_graphs(self, max_num_seqs: int, max_model_len: int | None, enforce_eager: bool,
                     pad_on_cpu: bool = False, num_speculative_tokens: int = 0, draft_graph: str = "chain") -> None:
        """Capture decode graphs, and with speculation verify / commit / draft graphs, with draft_graph chain
        the chained drafts of num_speculative_tokens depths too, with fused also the spec graphs run after a
        verify graph (`execute_spec`) (CUDA; not with enforce_eager). pad_on_cpu runs the same padded,
        fixed-shape steps eagerly (tests on CPU)."""
        from tpserve.engine.graphs import StepGraphs

        if enforce_eager or (self.device.type != "cuda" and not pad_on_cpu):
            return
        shape = self.cache_shape
        longest = min(max_model_len or self.cfg.max_position_embeddings, shape.num_blocks * shape.block_size)
        self.graphs = StepGraphs(self, max_num_seqs, -(-longest // shape.block_size),
                                 capture=self.device.type == "cuda", max_query=1 + num_speculative_tokens,
                                 chain=draft_graph in ("chain", "fused"), fused=draft_graph == "fused")
        self.graphs.capture_all()

    def verify_graph_batch(self) -> int | None:
        """The largest batch whose verify / draft steps replay CUDA graphs (0: none do), or None when
        no step replays a graph (eager, or CPU): above it a drafting step runs eagerly while a plain
        decode step replays its graph."""
        if self.graphs is None or not self.graphs.capture:
            return None
        return max(self.graphs.spec_buckets, default=0)

    def spec_step_limits(self) -> tuple[int, int]:
        """(largest batch, positions a sequence's rows may reach) of a fused speculative step
        (`execute_spec`); (0, 0): none runs here."""
        g = self.graphs
        if g is None or not g.fused:
            return 0, 0
        return g.spec_buckets[-1], g.max_blocks * g.block_size

    def execute_spec(self, plan: StepPlan, while_waiting=None) -> tuple[list[list[int]], list[int], list]:
        """A greedy speculative step in two graph replays and one host copy (engine/graphs.py `spec_step`):
        every sequence of `plan` verifies 1 to num_speculative_tokens drafts (padded to that many); acceptance,
        the KDA commit and the next drafts run on the device; while_waiting (host work, no device call) runs
        between the launch and the copy. -> (argmax of each verify row, padding rows' included, accepted
        drafts, the next drafts' draws [2][depths][sequence])."""
        g = self.graphs
        key = g.key_for(plan) if g is not None and g.fused else None
        if key is None or key[2] == 1 or len(plan.logits_indices) != len(plan.input_ids):
            raise ValueError(f"execute_spec: the plan is not a verify step of {self.spec_step_limits()[0]} or "
                             "fewer sequences with every row's logits and 1 to num_speculative_tokens drafts each")
        key = ("main", key[1], g.max_q)  # every sequence padded to the spec graphs' rows
        self._prepare_slots(plan)
        self.graph_verify, self.last_hidden = None, None
        return g.spec_step(plan, key, while_waiting)

    def chain_depths(self, plan: StepPlan | None = None) -> int:
        """Depths a draft(..., depths=n) call chains in one graph step, for `plan` when one is given (it
        needs a chain graph and a logits row per sequence); 0: one depth per call."""
        if self.graphs is None or not self.graphs.chain_depths:
            return 0
        if plan is not None and self._chain_key(plan) is None:
            return 0
        return self.graphs.chain_depths

    def _chain_key(self, plan: StepPlan):
        """The chain graph that runs `plan` (one logits row per sequence), or None."""
        if len(plan.logits_indices) != len(plan.slots):
            return None
        return self.graphs.key_for(plan, "chain")

    def build_batch(self, plan: StepPlan, prev: torch.Tensor | None = None) -> ForwardBatch:
        dev, bs = self.device, self.cache_shape.block_size
        width = max((len(t) for t in plan.block_tables), default=1) or 1
        tables = torch.zeros(len(plan.block_tables), width, dtype=torch.long)
        for i, t in enumerate(plan.block_tables):
            tables[i, :len(t)] = torch.tensor(t, dtype=torch.long)
        positions = torch.tensor(plan.positions, dtype=torch.long)
        owner = torch.repeat_interleave(torch.arange(len(plan.context_lens)),
                                        torch.tensor(plan.cu_seqlens[1:]) - torch.tensor(plan.cu_seqlens[:-1]))
        slot_mapping = tables[owner, positions // bs] * bs + positions % bs
        if prev is not None:  # async scheduling: the ids are the in-flight step's tokens, on the device
            ids = prev.index_select(0, to_device(plan.prev_rows, dev, torch.long))
        else:
            ids = to_device(plan.input_ids, dev, torch.long)
        # (every copy non-blocking: a blocking one waits for the queued kernels, an in-flight step's too)
        return ForwardBatch(
            input_ids=ids, positions=positions.to(dev, non_blocking=True), cu_seqlens=list(plan.cu_seqlens),
            context_lens=list(plan.context_lens), slots=to_device(plan.slots, dev, torch.long),
            block_tables=tables.to(dev, non_blocking=True), slot_mapping=slot_mapping.to(dev, non_blocking=True),
            logits_indices=to_device(plan.logits_indices, dev, torch.long),
            sequence_parallel=plan.sequence_parallel, token_seq=owner.to(dev, non_blocking=True),
            decode_seqs=plan.num_decode, state_saves=list(plan.state_saves))

    def execute(self, plan: StepPlan, prev: torch.Tensor | None = None) -> torch.Tensor:
        """plan's forward -> logits at plan.logits_indices. prev: the in-flight step's tokens, the input ids of
        a plan with prev_rows (async scheduling)."""
        if (prev is None) != (plan.prev_rows is None):
            raise ValueError("execute: a plan with prev_rows needs the in-flight tokens (prev), and only it")
        self._prepare_slots(plan)
        key = None if self.graphs is None else self.graphs.key_for(plan)
        if key is not None:
            logits, hidden = self.graphs.run(plan, key, prev)
            # a verify graph verifies every sequence (one-row decodes too): the commit replays them all
            cu = plan.cu_seqlens
            self.graph_verify = (key, [b - a for a, b in zip(cu, cu[1:])]) if key[2] > 1 else None
        else:
            self.graph_verify = None
            logits, hidden = self.model.forward_hidden(self.build_batch(plan, prev), self.cache)
        self.last_hidden = hidden if self.mtp else None
        return logits

    def _prepare_slots(self, plan: StepPlan) -> None:
        """The plan's state copies (prefix caching: checkpoints saved, then restored), then its fresh slots
        zeroed; on the device, queued before the forward."""
        for src, dst in cache_mod.copy_waves(plan.state_copies):
            cache_mod.copy_slots(self.cache, to_device(src, self.device, torch.long),
                                 to_device(dst, self.device, torch.long))
        cache_mod.reset_slots(self.cache, plan.reset_slots)

    # ------------------------------------------------------- speculative decoding
    def commit(self, counts: list[int]) -> None:
        """Commit the accepted prefix of each verify sequence of the last step (model/kda.py)."""
        if self.graph_verify is not None:
            key, lens = self.graph_verify
            self.graph_verify = None
            verified = iter(counts)  # counts of the sequences with drafts; a one-row decode commits its row
            self.graphs.commit(key, [1 if n == 1 else next(verified) for n in lens])
            return
        kda_commit(self.cache, counts)

    @torch.inference_mode()
    def draft(self, plan: StepPlan, source_rows: list[int], from_main: bool, depths: int = 1) -> Drafted:
        """One MTP depth over `plan`'s tokens (the token after each position). Hidden inputs: rows
        `source_rows` of the main model's last hidden (from_main) or of the previous depth's output.
        -> fp32 logits at plan.logits_indices (their hidden rows feed the next depth) and the rows'
        greedy draws (computed inside the draft graph where one replays).
        depths > 1 (a chain graph, `chain_depths()`; every sequence of the plan wants one logits row):
        that many depths, each fed the previous one's greedy draft on the device -> Drafted with no
        logits and greedy [2, depths, sequences]."""
        if not self.mtp:
            raise RuntimeError("draft: the model was built without the MTP drafter")
        src = self.last_hidden if from_main else self.draft_hidden
        if depths > 1:
            key = self._chain_key(plan) if self.chain_depths() else None
            if key is None or depths != self.graphs.chain_depths:
                raise ValueError(f"draft: {depths} chained depths asked; this plan can chain "
                                 f"{self.chain_depths(plan)} (0: no chain graph runs it)")
            return Drafted(None, self.graphs.draft_chain(plan, key, src, source_rows))
        # index sharing: a chained depth attends over its sequence's catch-up selection (model/mtp.py)
        share = self.model.mtp.share_selection
        reuse = self.draft_selection if share and not from_main else None
        key = None if self.graphs is None or self.graphs.hidden_in is None else self.graphs.key_for(plan, "draft")
        if key is not None and reuse is not None:
            key = ("reuse", key[1], 1) if key[2] == 1 else None
        if key is not None:
            logits, self.draft_hidden, greedy, self.draft_selection = self.graphs.draft(plan, key, src, source_rows,
                                                                                      reuse)
            return Drafted(logits, greedy)
        batch = self.build_batch(plan)
        rows = to_device(source_rows, self.device, torch.long)
        out, selection = self.model.mtp.draft(src[rows], self.model.embed(batch.input_ids, batch), batch, self.cache,
                                              None if reuse is None else reuse[rows], keep=batch.logits_indices)
        if not plan.logits_indices:  # rows that only write the MTP cache (a prompt's before its last)
            return Drafted(None, None)
        self.draft_hidden = out
        self.draft_selection = selection[batch.logits_indices] if share else None
        logits = self.model.lm_logits(self.draft_hidden)
        return Drafted(logits, self.ops.argmax_probability(logits))

    def close(self) -> None:
        """Release graphs and their memory pool (before the process group goes)."""
        if self.graphs is not None:
            self.graphs.close()
            self.graphs = None
