"""The step plan crosses ranks as int64 tensors (no pickling) and comes back identical."""

import dataclasses

from tpserve.engine.tp import plan_wire
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


def test_state_copies_roundtrip():
    """Prefix caching's checkpoint saves and restores travel with the plan, in order."""
    plan = StepPlan([5], [9], [0, 1], [9], [2], [[4]], [0], [3], state_copies=[(2, 70), (70, 3), (71, 2)])
    header, payload = plan_wire.encode(plan)
    assert payload.numel() == plan_wire.message_size(header)
    assert _roundtrip(plan).state_copies == [(2, 70), (70, 3), (71, 2)]
    assert plan_wire.decode_message(header, payload).plan == plan


def test_empty_tables_and_lists_roundtrip():
    plan = StepPlan([1], [0], [0, 1], [0], [0], [[]], [], [], False, 0)
    assert dataclasses.asdict(_roundtrip(plan)) == dataclasses.asdict(plan)


def _message(header, payload):
    assert payload.numel() == plan_wire.message_size(header)
    return plan_wire.decode_message(header.clone(), payload.clone())


def test_step_draft_and_commit_messages_roundtrip():
    import pytest

    plan = StepPlan([5, 7, 9], [4, 5, 6], [0, 3], [4], [1], [[2, 3]], [0, 1, 2], [], False, 1)
    step = _message(*plan_wire.encode(plan))
    assert step.kind == plan_wire.STEP and step.plan == plan and step.rows == []
    fused = _message(*plan_wire.encode(plan, plan_wire.SPEC))  # a fused speculative step (execute_spec)
    assert fused.kind == plan_wire.SPEC and fused.plan == plan and fused.rows == []
    for from_main, kind in ((True, plan_wire.DRAFT_MAIN), (False, plan_wire.DRAFT_CHAIN)):
        msg = _message(*plan_wire.encode_draft(plan, [7, 0, 3], from_main))
        assert (msg.kind, msg.plan, msg.rows, msg.depths) == (kind, plan, [7, 0, 3], 1)
    deep = _message(*plan_wire.encode_draft(plan, [7, 0, 3], True, depths=3))  # a chain graph's draft step
    assert (deep.kind, deep.plan, deep.rows, deep.depths) == (plan_wire.DRAFT_MAIN, plan, [7, 0, 3], 3)
    commit = _message(*plan_wire.encode_commit([3, 1, 0, 2]))
    assert (commit.kind, commit.plan, commit.rows) == (plan_wire.COMMIT, None, [3, 1, 0, 2])
    assert _message(*plan_wire.encode_commit([])).rows == []
    with pytest.raises(ValueError, match="source_rows"):
        plan_wire.encode_draft(plan, [0, 1], True)


def test_async_step_carries_its_rows_of_the_inflight_tokens():
    """A step with prev_rows (async scheduling) travels as STEP_PREV with the in-flight token count; it comes back
    as a STEP whose plan has the same rows."""
    import pytest

    plan = StepPlan([-1, -1, -1], [9, 4, 6], [0, 1, 2, 3], [9, 4, 6], [3, 1, 0], [[2], [5], [1]], [0, 1, 2], [],
                    False, 3, prev_rows=[2, 0, 4])
    header, payload = plan_wire.encode_step(plan, prev_tokens=5)
    assert int(header[0]) == plan_wire.STEP_PREV
    msg = _message(header, payload)
    assert msg.kind == plan_wire.STEP and msg.plan == plan and msg.prev_tokens == 5
    plain = dataclasses.replace(plan, prev_rows=None)
    assert plan_wire.encode_step(plain)[0][0] == plan_wire.STEP
    assert _message(*plan_wire.encode_step(plain)).plan == plain
    with pytest.raises(ValueError, match="prev_rows: 2 rows for 3 tokens"):
        plan_wire.encode_step(dataclasses.replace(plan, prev_rows=[0, 1]))
