"""The step plan on the wire: rank 0 sends each step to the other ranks as two int64 tensors
(a fixed 8-entry header, then a payload whose size the header gives), never a pickled object.

Payload layout, in order: input_ids [T], positions [T], cu_seqlens [B+1], context_lens [B],
slots [B], block-table lengths [B], block tables [B x width] (-1 padded), logits_indices [N],
reset_slots [R].
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

from tpserve.engine.runner import StepPlan

HEADER = 8
STEP, STOP = 1, 2


def encode(plan: StepPlan) -> tuple[torch.Tensor, torch.Tensor]:
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
    header = torch.tensor([STEP, t, b, width, len(plan.logits_indices), len(plan.reset_slots),
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


def send(plan: StepPlan | None, group) -> None:
    """Rank 0: broadcast a plan (None: tell the other ranks to stop)."""
    if plan is None:
        dist.broadcast(torch.tensor([STOP] + [0] * (HEADER - 1), dtype=torch.long), src=0, group=group)
        return
    header, payload = encode(plan)
    dist.broadcast(header, src=0, group=group)
    dist.broadcast(payload, src=0, group=group)


def receive(group) -> StepPlan | None:
    """Other ranks: the next plan from rank 0, or None when told to stop."""
    header = torch.empty(HEADER, dtype=torch.long)
    dist.broadcast(header, src=0, group=group)
    if int(header[0]) == STOP:
        return None
    payload = torch.empty(payload_size(header), dtype=torch.long)
    dist.broadcast(payload, src=0, group=group)
    return decode(header, payload)
