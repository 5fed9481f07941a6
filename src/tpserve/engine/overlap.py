"""Async scheduling (vLLM's `--async-scheduling`): decode step N+1 is launched before the host has read step
N's tokens.

A plain decode step whose sequences all sample without reading their own earlier tokens on the host (no
repetition / presence / frequency penalty, no grammar) can be left in flight: its tokens stay on the device,
one non-blocking copy brings them (with the logprobs asked for) to pinned host memory, and each sequence gets
a placeholder token (PENDING). The next step, when it decodes exactly those sequences again (no request
waiting, none preempted, none ending by length on the pending token), reads its input ids from the device
tokens (`StepPlan.prev_rows`) and is launched first; then the host lands the in-flight tokens: appends them,
checks stops, detokenizes, while the GPU runs the new step. A sequence that a landed token ends (EOS, a stop
id or string) was scheduled once more; that step's token is dropped. Any other step first drains the one in
flight and runs as before, so every output is the one the synchronous engine gives (tests/engine/
test_async_scheduling.py), with one exception vLLM's async scheduling shares: the dropped step of an ended
sequence still drew its noise, so sampled requests without a seed (they share the engine's generator) draw
differently after another request stops early; requests with a seed draw from their own. At TP > 1 the sampled
tokens live on rank 0's device: the step that takes them sends them to the other ranks' devices behind its plan
(engine/tp/plan_wire.py STEP_PREV). With speculative decoding only on the speculator's idle steps (`Speculator.idle`:
drafting stopped for the running requests).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tpserve.engine import sampler
from tpserve.engine.request import Sequence

PENDING = -1  # a sequence's last output id while its token is in flight


@dataclass
class Inflight:
    """A launched decode step whose tokens the host has not read."""

    seqs: list[Sequence]
    rows: dict[Sequence, int]   # each sequence's row of `tokens`
    tokens: torch.Tensor        # [n] long, on the device: the next step's input ids
    host: torch.Tensor          # sampler.pack_results' rows, copied without blocking
    event: torch.cuda.Event | None

    def land(self) -> list[sampler.SampleResult]:
        """Wait for the copy (not for later work on the device) -> one result per sequence."""
        if self.event is not None:
            self.event.synchronize()
        return sampler.unpack_results(self.host.numpy(), self.seqs)


def pipelinable(seq: Sequence) -> bool:
    """The sequence's next token can be chosen before the host knows its last one."""
    p = seq.params
    return (p.structured_outputs is None and p.repetition_penalty == 1.0 and not p.presence_penalty
            and not p.frequency_penalty)


def launch(logits: torch.Tensor, seqs: list[Sequence], generator: torch.Generator) -> Inflight:
    """Choose each sequence's token on the device and start its copy to the host; nothing waits."""
    tokens = sampler.choose(logits, seqs, generator)
    packed = sampler.pack_results(logits, seqs, tokens)
    if packed.device.type == "cuda":
        host = torch.empty(packed.shape, dtype=packed.dtype, pin_memory=True)
        host.copy_(packed, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
    else:
        host, event = packed, None
    return Inflight(list(seqs), {s: i for i, s in enumerate(seqs)}, tokens, host, event)


def drop_pending(seq: Sequence) -> None:
    """Take a placeholder off the end of the sequence's outputs (its token is landed or dropped)."""
    if seq.output_ids and seq.output_ids[-1] == PENDING:
        seq.output_ids.pop()


def ready(inflight: Inflight, scheduler, max_model_len: int) -> bool:
    """The next step may be launched before `inflight` lands: it will decode exactly the in-flight sequences
    still running, one token each, without preempting anyone."""
    running = scheduler.running
    if scheduler.waiting or len(running) > scheduler.token_budget:
        return False
    if any(s not in inflight.rows or s.is_finished for s in running):
        return False
    need = 0
    for s in running:
        if len(s.output_ids) >= s.max_tokens or s.num_tokens >= max_model_len:  # the pending token ends it
            return False
        need += -(-s.num_tokens // scheduler.block_size) > len(s.blocks)
    return need <= scheduler.blocks.num_free
