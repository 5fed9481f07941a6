"""The start-up log breaks the model's boot into phases (engine/executor.py, model/build.py): the model planned on
the meta device, the weights (restored from a snapshot, or loaded and processed), the kernel self-tests; then the
cache and the graphs. bench/boot_snapshot.py reads this line."""

import logging
import re

from tpserve import LLM

LINE = re.compile(r"boot: model and weights ([\d.]+) s \(the model planned on the meta device ([\d.]+) s, "
                  r"weights ([\d.]+) s, kernel self-tests ([\d.]+) s\), cache ([\d.]+) s, graphs ([\d.]+) s")


def _boot(caplog, path, **kw):
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="tpserve.executor"):
        llm = LLM(str(path), device="cpu", kv_cache_memory="8MiB", block_size=16, **kw)
    llm.shutdown()
    found = [LINE.search(r.getMessage()) for r in caplog.records if r.name == "tpserve.executor"]
    found = [m for m in found if m]
    assert len(found) == 1, [r.getMessage() for r in caplog.records]
    restored = any("restored from snapshot" in r.getMessage() for r in caplog.records)
    return llm, restored, [float(x) for x in found[0].groups()]


def test_boot_line_has_each_phase_and_they_add_up(tiny, tmp_path, caplog):
    for boot, from_snapshot in (("first (writes the snapshot)", False), ("from the snapshot", True)):
        llm, restored, (total, plan, weights, tests, cache, graphs) = _boot(caplog, tiny(), snapshot=True,
                                                                            snapshot_dir=str(tmp_path))
        assert restored == from_snapshot, boot
        phases = llm.engine.executor.runner.boot_seconds
        assert set(phases) == {"plan", "weights"}  # no fla self-tests on a CPU
        assert min(total, plan, weights, cache, graphs) >= 0 and tests == 0
        # the line rounds each value to 10 ms: two phases and the total may differ by up to 15 ms (and float sums)
        assert plan + weights <= total + 0.015 + 1e-9, boot
