"""The step plan on the wire: rank 0 sends each step to the other ranks as two int64 tensors
(a fixed 8-entry header, then a payload whose size the header gives), never a pickled object.

Payload layout, in order: input_ids [T], positions [T], cu_seqlens [B+1], context_lens [B],
slots [B], block-table lengths [B], block tables [B x width] (-1 padded), logits_indices [N],
reset_slots [R].

Speculative decoding adds two messages: an MTP draft step (header[0] DRAFT_MAIN or DRAFT_CHAIN:
the hidden rows come from the main model or the previous depth; the payload is the plan's, then
the source rows [T], then the number of chained depths [1]), a KDA commit (header [COMMIT, n, 0, ...],
payload: the n accepted counts) and a fused speculative step (header[0] SPEC, the plan's layout:
ModelRunner.execute_spec).
`receive` returns a Message.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
import torch.distributed as dist

from tpserve.engine.runner import StepPlan

HEADER = 8
STEP, STOP, COMMIT, DRAFT_MAIN, DRAFT_CHAIN, SPEC = 1, 2, 3, 4, 5, 6


@dataclass(frozen=True)
class Message:
    """What a rank other than 0 is told to run: kind STEP or SPEC (plan), DRAFT_* (plan, rows) or COMMIT
    (counts)."""
    kind: int
    plan: StepPlan | None = None
    rows: list[int] = field(default_factory=list)  # DRAFT_*: source rows; COMMIT: accepted counts
    depths: int = 1  # DRAFT_*: depths chained in one graph step (ModelRunner.draft)


def encode(plan: StepPlan, kind: int = STEP) -> tuple[torch.Tensor, torch.Tensor]:
    t, b = len(plan.input_ids), len(plan.slots)
    lens = [len(row) for row in plan.block_tables]
    width = max(lens, default=0)
    tables = np.full((b, width), -1, dtype=np.int64)
    for i, row in enumerate(plan.block_tables):
        tables[i, :len(row)] = row
    parts = [plan.input_ids, plan.positions, plan.cu_seqlens, plan.context_lens, plan.slots, lens]
    payload = np.concatenate([np.asarray(p, dtype=np.int64) for p in parts]
                             + [tables.reshape(-1), np.asarray(plan.logits_indices, dtype=np.int64),
                                np.asarray(plan.reset_slots, dtype=np.int64)])
    header = torch.tensor([kind, t, b, width, len(plan.logits_indices), len(plan.reset_slots),
                           int(plan.sequence_parallel), plan.num_decode], dtype=torch.long)
    return header, torch.from_numpy(payload)


def payload_size(header: torch.Tensor) -> int:
    _, t, b, width, n, r = header[:6].tolist()
    return 2 * t + (b + 1) + 3 * b + b * width + n + r


def decode(header: torch.Tensor, payload: torch.Tensor) -> StepPlan:
    _, t, b, width, n, r, sp, num_decode = header.tolist()
    flat = payload.numpy()
    out, at = [], 0
    for size in (t, t, b + 1, b, b, b):
        out.append(flat[at:at + size].tolist())
        at += size
    ids, pos, cu, ctx, slots, lens = out
    tables = flat[at:at + b * width].reshape(b, width) if width else np.zeros((b, 0), dtype=np.int64)
    at += b * width
    logits = flat[at:at + n].tolist()
    reset = flat[at + n:at + n + r].tolist()
    return StepPlan(ids, pos, cu, ctx, slots, [tables[i, :lens[i]].tolist() for i in range(b)], logits, reset,
                    bool(sp), num_decode)


def encode_draft(plan: StepPlan, source_rows: list[int], from_main: bool,
                 depths: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """An MTP draft step (ModelRunner.draft's arguments) as (header, payload)."""
    if len(source_rows) != len(plan.input_ids):
        raise ValueError(f"source_rows: {len(source_rows)} rows for {len(plan.input_ids)} tokens")
    header, payload = encode(plan, DRAFT_MAIN if from_main else DRAFT_CHAIN)
    return header, torch.cat([payload, torch.tensor(list(source_rows) + [depths], dtype=torch.long)])


def encode_commit(counts: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """A KDA commit (ModelRunner.commit's accepted counts) as (header, payload)."""
    header = torch.tensor([COMMIT, len(counts)] + [0] * (HEADER - 2), dtype=torch.long)
    return header, torch.tensor(counts, dtype=torch.long)


def message_size(header: torch.Tensor) -> int:
    """Payload entries of any message but STOP."""
    kind, tokens = int(header[0]), int(header[1])
    if kind == COMMIT:
        return tokens
    return payload_size(header) + (tokens + 1 if kind in (DRAFT_MAIN, DRAFT_CHAIN) else 0)


def decode_message(header: torch.Tensor, payload: torch.Tensor) -> Message:
    kind, tokens = int(header[0]), int(header[1])
    if kind == COMMIT:
        return Message(kind, rows=payload.tolist())
    if kind in (STEP, SPEC):
        return Message(kind, decode(header, payload))
    if kind not in (DRAFT_MAIN, DRAFT_CHAIN):
        raise ValueError(f"plan wire: unknown message kind {kind}")
    cut = payload.numel() - tokens - 1
    tail = payload[cut:].tolist()
    return Message(kind, decode(header, payload[:cut]), tail[:-1], tail[-1])


def send(plan: StepPlan | None, group) -> None:
    """Rank 0: broadcast a plan (None: tell the other ranks to stop)."""
    if plan is None:
        dist.broadcast(torch.tensor([STOP] + [0] * (HEADER - 1), dtype=torch.long), src=0, group=group)
        return
    broadcast(*encode(plan), group)


def broadcast(header: torch.Tensor, payload: torch.Tensor, group) -> None:
    """Rank 0: send one encoded message."""
    dist.broadcast(header, src=0, group=group)
    dist.broadcast(payload, src=0, group=group)


def receive(group) -> Message | None:
    """Other ranks: the next message from rank 0, or None when told to stop."""
    header = torch.empty(HEADER, dtype=torch.long)
    dist.broadcast(header, src=0, group=group)
    if int(header[0]) == STOP:
        return None
    payload = torch.empty(message_size(header), dtype=torch.long)
    dist.broadcast(payload, src=0, group=group)
    return decode_message(header, payload)
