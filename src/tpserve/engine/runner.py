"""ModelRunner: one rank's model, cache tensors and forward step.

Rank 0 turns the scheduler's decisions into a StepPlan (plain lists, cheap to send to the other
ranks); every rank turns the same plan into a ForwardBatch on its device and runs the forward.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

import torch

from tpserve.engine import cache as cache_mod
from tpserve.kernels.choice import Kernels
from tpserve.model.batch import ForwardBatch
from tpserve.model.config import ModelConfig
from tpserve.model.layers import ShardContext
from tpserve.model.build import build_model

log = logging.getLogger("tpserve.runner")


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

    @property
    def is_uniform_decode(self) -> bool:
        """Every sequence is a one-token decode (a CUDA-graph step)."""
        return self.num_decode == len(self.slots) == len(self.input_ids) and not self.sequence_parallel


@dataclass(frozen=True)
class CacheShape:
    num_blocks: int
    num_slots: int
    block_size: int


class ModelRunner:
    def __init__(self, model_dir: str, cfg: ModelConfig, ctx: ShardContext, device: torch.device,
                 kernels: Kernels, progress: bool | None = None, load_format: str = "auto"):
        self.cfg, self.ctx, self.device = cfg, ctx, device
        self.model = build_model(model_dir, cfg, ctx, device, kernels, load_format=load_format, progress=progress)
        self.kernels = kernels
        self.kda_report = f"{kernels.kda} KDA path"
        if kernels.kda == "fla":
            self._configure_fla()
        self.cache = None
        self.cache_shape: CacheShape | None = None
        self.graphs = None  # engine.graphs.DecodeGraphs once set up

    def _configure_fla(self) -> None:
        """Check fla-core's kernels against the torch references once, on this device and head size;
        use the options that agree, or the torch path for KDA if none does."""
        from tpserve.kernels.kda import select_fla_options
        from tpserve.model.kda import KdaAttention

        layers = [m for m in self.model.modules() if isinstance(m, KdaAttention)]
        if not layers:
            return
        opts, report = select_fla_options(self.cfg.linear_head_dim, self.cfg.linear_lower_bound, self.device)
        log.info("fla-core KDA self-test (head_dim %d): %s", self.cfg.linear_head_dim, report)
        if opts is None:
            log.warning("fla-core KDA kernels disagree with the reference here (%s); using the torch path", report)
            self.kernels = dataclasses.replace(self.kernels, kda="torch")
        for layer in layers:
            layer.backend = "torch" if opts is None else "fla"
            layer.fla_options = opts or {}
        self.kda_report = report

    def allocate_cache(self, shape: CacheShape) -> None:
        """The scheduler's blocks and slots, plus one reserved dummy block (id num_blocks) and dummy
        slot (id num_slots): padding rows of graph steps and pools no token completes write there."""
        self.cache_shape = shape
        self.cache = cache_mod.allocate_cache(self.cfg, num_blocks=shape.num_blocks + 1, block_size=shape.block_size,
                                              num_slots=shape.num_slots + 1, world=self.ctx.world,
                                              dtype=self.ctx.dtype, device=self.device)

    def setup_graphs(self, max_num_seqs: int, max_model_len: int | None, enforce_eager: bool,
                     pad_on_cpu: bool = False) -> None:
        """Capture decode graphs (CUDA; not with enforce_eager). pad_on_cpu runs the same padded,
        fixed-shape steps eagerly (tests of the padding on CPU)."""
        from tpserve.engine.graphs import DecodeGraphs

        if enforce_eager or (self.device.type != "cuda" and not pad_on_cpu):
            return
        shape = self.cache_shape
        longest = min(max_model_len or self.cfg.max_position_embeddings, shape.num_blocks * shape.block_size)
        self.graphs = DecodeGraphs(self, max_num_seqs, -(-longest // shape.block_size),
                                   capture=self.device.type == "cuda")
        self.graphs.capture_all()

    def build_batch(self, plan: StepPlan) -> ForwardBatch:
        dev, bs = self.device, self.cache_shape.block_size
        width = max((len(t) for t in plan.block_tables), default=1) or 1
        tables = torch.zeros(len(plan.block_tables), width, dtype=torch.long)
        for i, t in enumerate(plan.block_tables):
            tables[i, :len(t)] = torch.tensor(t, dtype=torch.long)
        positions = torch.tensor(plan.positions, dtype=torch.long)
        owner = torch.repeat_interleave(torch.arange(len(plan.context_lens)),
                                        torch.tensor(plan.cu_seqlens[1:]) - torch.tensor(plan.cu_seqlens[:-1]))
        slot_mapping = tables[owner, positions // bs] * bs + positions % bs
        return ForwardBatch(
            input_ids=torch.tensor(plan.input_ids, dtype=torch.long, device=dev),
            positions=positions.to(dev), cu_seqlens=list(plan.cu_seqlens), context_lens=list(plan.context_lens),
            slots=torch.tensor(plan.slots, dtype=torch.long, device=dev), block_tables=tables.to(dev),
            slot_mapping=slot_mapping.to(dev), logits_indices=torch.tensor(plan.logits_indices, dtype=torch.long, device=dev),
            sequence_parallel=plan.sequence_parallel, token_seq=owner.to(dev), decode_seqs=plan.num_decode)

    def execute(self, plan: StepPlan) -> torch.Tensor:
        cache_mod.reset_slots(self.cache, plan.reset_slots)
        if self.graphs is not None and plan.is_uniform_decode and self.graphs.fits(plan):
            return self.graphs.run(plan)
        return self.model(self.build_batch(plan), self.cache)

    def close(self) -> None:
        """Release graphs and their memory pool (before the process group goes)."""
        if self.graphs is not None:
            self.graphs.close()
            self.graphs = None
