"""What one forward step reads: the flattened tokens of every scheduled sequence and the cache.

The engine builds a ForwardBatch per step (prefill chunks and decodes together); the model
only reads it. Tokens are flattened: sequence i owns rows cu_seqlens[i]:cu_seqlens[i+1].
Every sequence has a query length >= 1 (1 for a decode, 1+k for verifying k drafts, n for a
prefill chunk); decode/verify sequences come first (`decode_seqs`) and take the decode kernels.
Nothing in a decode forward reads host values other than shapes, so it can be graph-captured.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class CacheTensors:
    """Per-layer cache tensors (shapes as in DESIGN.md; this rank's share of heads)."""

    block_size: int
    latent: dict[int, torch.Tensor] = field(default_factory=dict)      # [blocks, bs, kv_lora]
    index_k: dict[int, torch.Tensor] = field(default_factory=dict)     # [blocks, bs, idx_dim]
    index_gate: dict[int, torch.Tensor] = field(default_factory=dict)  # [blocks, bs, idx_dim]
    pool_k: dict[int, torch.Tensor] = field(default_factory=dict)      # [blocks, bs/kpool, idx_dim]
    kda_state: dict[int, torch.Tensor] = field(default_factory=dict)   # [slots, H_local, K, V] fp32
    conv_state: dict[int, torch.Tensor] = field(default_factory=dict)  # [slots, conv_local, k-1]
    # every KDA layer's states in one tensor each ([layers, slots, ...]; the dicts hold views of them), so one
    # slot's states move in one copy (prefix caching's checkpoints; model/cache.py copy_slots)
    kda_stack: torch.Tensor | None = None
    conv_stack: torch.Tensor | None = None
    # the last step's verified KDA inputs per layer (model/kda.py VerifyInputs), until committed
    verify: dict[int, object] = field(default_factory=dict)


@dataclass
class ForwardBatch:
    input_ids: torch.Tensor          # [T] long
    positions: torch.Tensor          # [T] long, position of each token in its sequence
    cu_seqlens: list[int]            # [B+1] host offsets into the flattened tokens
    context_lens: list[int]          # [B] tokens already in the cache before this step
    slots: torch.Tensor              # [B] long, KDA state slot of each sequence
    block_tables: torch.Tensor       # [B, max_blocks] long, -1 padded
    slot_mapping: torch.Tensor       # [T] long, flat cache row (block * bs + offset) per token
    logits_indices: torch.Tensor     # [N] long, rows whose next-token logits are wanted
    sequence_parallel: bool = False  # split the residual stream across ranks this step
    token_seq: torch.Tensor | None = None  # [T] long, index of the sequence owning each token
    decode_seqs: int = 0             # the first decode_seqs sequences take the decode kernels
    fixed_shapes: bool = False       # a graph step: shapes from the buffers only, never from host lengths
    query_len: int = 1               # in a fixed-shape step: rows of every decode sequence (1, or 1+k to verify)
    # prefix caching: (sequence, rows, checkpoint slot): the KDA / conv states of a prefill sequence after its
    # first `rows` rows of this step are copied into the checkpoint slot (model/kda.py), so a chunk need not
    # end where a checkpoint is kept
    state_saves: list[tuple[int, int, int]] = field(default_factory=list)
    # index tensors that depend on this batch only (not on a layer's weights), computed by the first layer
    # that needs them and reused by the others in the same forward (a graph step then launches their
    # kernels once, not once per layer); emptied at the start of every forward
    memo: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def num_seqs(self) -> int:
        return len(self.context_lens)

    @property
    def num_tokens(self) -> int:
        return self.cu_seqlens[-1]

    @property
    def is_decode(self) -> bool:
        return self.num_tokens == self.num_seqs == self.decode_seqs

    @property
    def has_prefill(self) -> bool:
        """Some sequence is a prefill chunk (never in a graph step)."""
        return not self.fixed_shapes and self.decode_seqs < self.num_seqs

    @property
    def decode_tokens(self) -> int:
        """Tokens [0, decode_tokens) belong to decode/verify sequences: per-token sparse attention
        over the indexer's selection (causality comes from the selection), never the dense path."""
        return self.cu_seqlens[self.decode_seqs]

    @property
    def single_token_seqs(self) -> int:
        """Leading decode sequences of one token each (the recurrent KDA / conv step applies to them).
        The decode sequences after them verify drafts: their KDA / conv states are read, not written
        (the engine commits the accepted tokens afterwards, model/kda.py)."""
        if self.fixed_shapes:  # a graph step of 1+k rows per sequence verifies every sequence
            return self.decode_seqs if self.query_len == 1 else 0
        if self.decode_tokens == self.decode_seqs:
            return self.decode_seqs
        n = 0
        while n < self.decode_seqs and self.cu_seqlens[n + 1] - self.cu_seqlens[n] == 1:
            n += 1
        return n

    def memoized(self, key: tuple, compute):
        """compute() the first time `key` is asked for in this forward, the same tensors after."""
        if key not in self.memo:
            self.memo[key] = compute()
        return self.memo[key]

    def seq_len(self, i: int) -> int:
        return self.cu_seqlens[i + 1] - self.cu_seqlens[i]

    def total_len(self, i: int) -> int:
        return self.context_lens[i] + self.seq_len(i)
