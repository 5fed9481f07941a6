"""Communicator construction: table agreement across ranks, fallbacks, world 1."""

from __future__ import annotations

import json

import torch
import torch.distributed as dist

from tpserve.config import EngineConfig
from tpserve.collectives.comm import Communicator
from tpserve.engine.tp.launch import spawn_ranks


def _scenarios(rank: int, world: int, tables: list[str]) -> dict:
    import logging

    out: dict = {}
    # 1. every rank given a different table: construction fails on every rank, clearly
    try:
        Communicator(dist.group.WORLD, torch.device("cpu"),
                     config=EngineConfig(collective_table=tables[rank]))
        out["mismatch"] = "constructed"
    except RuntimeError as exc:
        out["mismatch"] = str(exc)
    # 2. the same table everywhere: picks follow it
    comm = Communicator(dist.group.WORLD, torch.device("cpu"),
                        config=EngineConfig(collective_table=tables[0]))
    out["pick_small"] = comm.backend_for("all_reduce", torch.ones(4))
    out["pick_large"] = comm.backend_for("all_reduce", torch.ones(1 << 16))
    out["sum"] = comm.all_reduce(torch.full((5,), float(rank + 1))).tolist()
    comm.close()
    # 3. a workspace that cannot be built: every rank warns and uses gloo
    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("tpserve.collectives").addHandler(handler)
    comm = Communicator(dist.group.WORLD, torch.device("cpu"), workspace_bytes=1024)
    out["fallback_pick"] = comm.backend_for("all_reduce", torch.ones(4))
    out["fallback_sum"] = comm.all_reduce(torch.ones(3)).tolist()
    out["fallback_warned"] = any("unavailable" in r for r in records)
    comm.close()
    # 4. a rank that gives up (abort, e.g. from a watchdog) stops its peers' waits too; a peer
    #    whose process is gone is noticed by pid
    import subprocess

    import numpy as np

    from tpserve.collectives.shm import PeerLost, _pid_namespace

    comm = Communicator(dist.group.WORLD, torch.device("cpu"), timeout_s=60)
    child = subprocess.Popen(["true"])
    child.wait()
    header = np.zeros(8, dtype=np.int64)
    header[1], header[2] = child.pid, _pid_namespace()
    out["dead_peer"] = comm._ws.seg._peer_problem(1 - rank, header, 0.0, 1)
    if rank == 1:
        comm.abort("test abort")
    try:
        comm.all_reduce(torch.ones(4))
        out["abort"] = "no error"
    except PeerLost as exc:
        out["abort"] = str(exc)
    comm.close()
    # 5. switched off
    comm = Communicator(dist.group.WORLD, torch.device("cpu"),
                        config=EngineConfig(custom_allreduce=False))
    out["off_pick"] = comm.backend_for("all_reduce", torch.ones(4))
    out["off_ws"] = comm._ws is None
    comm.close()
    return out


def test_construction_scenarios(tmp_path):
    a = {"rules": [{"op": "all_reduce", "max_bytes": 1024, "backend": "oneshot"},
                   {"op": "all_reduce", "backend": "nccl"}]}
    b = {"rules": [{"op": "all_reduce", "backend": "twoshot"}]}
    paths = []
    for name, data in (("a.json", a), ("b.json", b)):
        (tmp_path / name).write_text(json.dumps(data))
        paths.append(str(tmp_path / name))
    ranks = spawn_ranks(_scenarios, 2, paths, timeout=180)
    for out in ranks:
        assert "differ between ranks" in out["mismatch"], out["mismatch"]
        assert out["pick_small"] == "oneshot" and out["pick_large"] == "torch"
        assert out["sum"] == [3.0] * 5
        assert out["fallback_pick"] == "torch" and out["fallback_sum"] == [2.0] * 3
        assert out["fallback_warned"]
        assert out["off_pick"] == "torch" and out["off_ws"]
        assert "gave up" in out["abort"] or "test abort" in out["abort"], out["abort"]
        assert "exited during a collective" in out["dead_peer"]


def test_stale_segment_names_are_reaped():
    import os
    import subprocess

    from tpserve.collectives.shm import SHM_DIR, reap_stale_segments

    child = subprocess.Popen(["true"])
    child.wait()
    dead = os.path.join(SHM_DIR, f"tpserve-ws-{'0' * 16}-0-{child.pid}")
    alive = os.path.join(SHM_DIR, f"tpserve-ws-{'0' * 16}-1-{os.getpid()}")
    for path in (dead, alive):
        open(path, "wb").close()
        os.utime(path, (0, 0))
    try:
        removed = reap_stale_segments()
        assert os.path.basename(dead) in removed and not os.path.exists(dead)
        assert os.path.exists(alive)
    finally:
        for path in (dead, alive):
            if os.path.exists(path):
                os.unlink(path)


def test_world_one_is_the_identity():
    comm = Communicator(None, torch.device("cpu"))
    x = torch.arange(6.0).view(2, 3)
    assert comm.all_reduce(x) is x
    assert comm.all_gather(x, dim=1) is x
    assert comm.reduce_scatter(x) is x
    assert comm.backend_for("all_reduce", x) == "identity"
    comm.close()
