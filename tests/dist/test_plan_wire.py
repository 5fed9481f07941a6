"""The step plan crosses ranks as int64 tensors (no pickling) and comes back identical."""

import dataclasses

from tpserve.dist import plan_wire
from tpserve.engine.runner import StepPlan


def _roundtrip(plan):
    header, payload = plan_wire.encode(plan)
    assert payload.numel() == plan_wire.payload_size(header)
    return plan_wire.decode(header.clone(), payload.clone())


def test_mixed_plan_roundtrip():
    plan = StepPlan(input_ids=[5, 7, 9, 11, 13], positions=[40, 3, 0, 1, 2], cu_seqlens=[0, 1, 2, 5],
                    context_lens=[40, 3, 0], slots=[2, 0, 5], block_tables=[[4, 9, 1], [3], [7, 8]],
                    logits_indices=[0, 1, 4], reset_slots=[5], sequence_parallel=True, num_decode=2)
    assert dataclasses.asdict(_roundtrip(plan)) == dataclasses.asdict(plan)


def test_empty_tables_and_lists_roundtrip():
    plan = StepPlan([1], [0], [0, 1], [0], [0], [[]], [], [], False, 0)
    assert dataclasses.asdict(_roundtrip(plan)) == dataclasses.asdict(plan)
