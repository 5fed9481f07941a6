"""The step plan on the wire: rank 0 sends each step to the other ranks as two int64 tensors
(a fixed 10-entry header, then a payload whose size the header gives), never a pickled object.

Payload layout, in order: input_ids [T], positions [T], cu_seqlens [B+1], context_lens [B],
slots [B], block-table lengths [B], block tables [B x width] (-1 padded), logits_indices [N],
reset_slots [R], state_copies [C x 2] (source, destination; prefix caching), state_saves [S x 3]
(sequence, rows, checkpoint slot; prefix caching).

Speculative decoding adds two messages: an MTP draft step (header[0] DRAFT_MAIN or DRAFT_CHAIN:
the hidden rows come from the main model or the previous depth; the payload is the plan's, then
the source rows [T], then the number of chained depths [1]), a KDA commit (header [COMMIT, n, 0, ...],
payload: the n accepted counts) and a fused speculative step (header[0] SPEC, the plan's layout:
ModelRunner.execute_spec).
Async scheduling adds STEP_PREV: a step whose input ids are rows of the in-flight step's tokens (StepPlan.prev_rows,
engine/overlap.py); the payload is the plan's, then prev_rows [T], then the in-flight token count [1]. Those
tokens exist only on rank 0's device: `send_tokens` / `receive_tokens` broadcast them over the device group
right after the message, so no rank's host waits for them.
`receive` returns a Message.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
import torch.distributed as dist

from tpserve.engine.runner import StepPlan

HEADER = 10
STEP, STOP, COMMIT, DRAFT_MAIN, DRAFT_CHAIN, SPEC, STEP_PREV = 1, 2, 3, 4, 5, 6, 7


@dataclass(frozen=True)
class Message:
    """What a rank other than 0 is told to run: kind STEP or SPEC (plan), DRAFT_* (plan, rows) or COMMIT
    (counts)."""
    kind: int
    plan: StepPlan | None = None
    rows: list[int] = field(default_factory=list)  # DRAFT_*: source rows; COMMIT: accepted counts
    depths: int = 1  # DRAFT_*: depths chained in one graph step (ModelRunner.draft)
    prev_tokens: int = 0  # STEP with plan.prev_rows: how many in-flight tokens follow (receive_tokens)


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
                                np.asarray(plan.reset_slots, dtype=np.int64),
                                np.asarray(plan.state_copies, dtype=np.int64).reshape(-1),
                                np.asarray(plan.state_saves, dtype=np.int64).reshape(-1)])
    header = torch.tensor([kind, t, b, width, len(plan.logits_indices), len(plan.reset_slots),
                           int(plan.sequence_parallel), plan.num_decode, len(plan.state_copies),
                           len(plan.state_saves)], dtype=torch.long)
    return header, torch.from_numpy(payload)


def payload_size(header: torch.Tensor) -> int:
    _, t, b, width, n, r, _, _, c, v = header.tolist()
    return 2 * t + (b + 1) + 3 * b + b * width + n + r + 2 * c + 3 * v


def decode(header: torch.Tensor, payload: torch.Tensor) -> StepPlan:
    _, t, b, width, n, r, sp, num_decode, c, v = header.tolist()
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
    at += n + r
    copies = [(int(s), int(d)) for s, d in flat[at:at + 2 * c].reshape(c, 2)]
    at += 2 * c
    saves = [(int(i), int(n), int(k)) for i, n, k in flat[at:at + 3 * v].reshape(v, 3)]
    return StepPlan(ids, pos, cu, ctx, slots, [tables[i, :lens[i]].tolist() for i in range(b)], logits, reset,
                    bool(sp), num_decode, state_copies=copies, state_saves=saves)


def encode_draft(plan: StepPlan, source_rows: list[int], from_main: bool,
                 depths: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """An MTP draft step (ModelRunner.draft's arguments) as (header, payload)."""
    if len(source_rows) != len(plan.input_ids):
        raise ValueError(f"source_rows: {len(source_rows)} rows for {len(plan.input_ids)} tokens")
    header, payload = encode(plan, DRAFT_MAIN if from_main else DRAFT_CHAIN)
    return header, torch.cat([payload, torch.tensor(list(source_rows) + [depths], dtype=torch.long)])


def encode_step(plan: StepPlan, prev_tokens: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A step; with prev_rows (async scheduling) as STEP_PREV, `prev_tokens` in-flight tokens to follow."""
    if plan.prev_rows is None:
        return encode(plan)
    if len(plan.prev_rows) != len(plan.input_ids):
        raise ValueError(f"prev_rows: {len(plan.prev_rows)} rows for {len(plan.input_ids)} tokens")
    header, payload = encode(plan, STEP_PREV)
    return header, torch.cat([payload, torch.tensor(list(plan.prev_rows) + [prev_tokens], dtype=torch.long)])


def encode_commit(counts: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """A KDA commit (ModelRunner.commit's accepted counts) as (header, payload)."""
    header = torch.tensor([COMMIT, len(counts)] + [0] * (HEADER - 2), dtype=torch.long)
    return header, torch.tensor(counts, dtype=torch.long)


def message_size(header: torch.Tensor) -> int:
    """Payload entries of any message but STOP."""
    kind, tokens = int(header[0]), int(header[1])
    if kind == COMMIT:
        return tokens
    return payload_size(header) + (tokens + 1 if kind in (DRAFT_MAIN, DRAFT_CHAIN, STEP_PREV) else 0)


def decode_message(header: torch.Tensor, payload: torch.Tensor) -> Message:
    kind, tokens = int(header[0]), int(header[1])
    if kind == COMMIT:
        return Message(kind, rows=payload.tolist())
    if kind in (STEP, SPEC):
        return Message(kind, decode(header, payload))
    if kind not in (DRAFT_MAIN, DRAFT_CHAIN, STEP_PREV):
        raise ValueError(f"plan wire: unknown message kind {kind}")
    cut = payload.numel() - tokens - 1
    tail = payload[cut:].tolist()
    plan = decode(header, payload[:cut])
    if kind == STEP_PREV:
        plan.prev_rows = tail[:-1]
        return Message(STEP, plan, prev_tokens=tail[-1])
    return Message(kind, plan, tail[:-1], tail[-1])


def send(plan: StepPlan | None, group, prev_tokens: int = 0) -> None:
    """Rank 0: broadcast a plan (None: tell the other ranks to stop)."""
    if plan is None:
        dist.broadcast(torch.tensor([STOP] + [0] * (HEADER - 1), dtype=torch.long), src=0, group=group)
        return
    broadcast(*encode_step(plan, prev_tokens), group)


def send_tokens(tokens: torch.Tensor, group=None) -> torch.Tensor:
    """Rank 0: the in-flight tokens of a STEP_PREV to the other ranks over the device group (`group`; None: the
    default group), queued on the device behind the step that chose them -> the tensor sent (long)."""
    tokens = tokens.to(torch.long).contiguous()
    dist.broadcast(tokens, src=0, group=group)
    return tokens


def receive_tokens(count: int, device: torch.device, group=None) -> torch.Tensor:
    """Other ranks: the in-flight tokens of the STEP_PREV just received."""
    tokens = torch.empty(count, dtype=torch.long, device=device)
    dist.broadcast(tokens, src=0, group=group)
    return tokens


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
