"""Tensor-parallel launch: one process per rank, rank 0 schedules and sends each step's plan.

Two ways to start:
- `LLM(tensor_parallel_size=N)` / `tpserve serve --tp N`: this process is rank 0 and spawns
  N-1 workers on this host (a free port is picked for the rendezvous).
- under `torchrun` (one or several nodes): torchrun starts every rank; rank 0 runs the engine,
  the others call `worker_loop`. The environment read: RANK, WORLD_SIZE, LOCAL_RANK,
  MASTER_ADDR, MASTER_PORT (plus any NCCL_* variable, passed through untouched).

Model collectives use the default group (NCCL on CUDA, gloo on CPU) through a Communicator;
plans travel over a separate gloo group. A watchdog on rank 0 notices a worker that exits and
marks the executor dead, so callers get EngineDeadError instead of hanging.
"""

from __future__ import annotations

import datetime
import logging
import multiprocessing as mp
import os
import threading
import time

import torch
import torch.distributed as dist

from tpserve.config import EngineConfig
from tpserve.collectives.comm import Communicator
from tpserve.engine.tp.launch import free_port, mp_context, set_environ
from tpserve.collectives.ncclenv import ensure_nccl_cumem
from tpserve.engine.executor import EngineDeadError, cache_budget
from tpserve.engine.tp import plan_wire
from tpserve.engine.runner import CacheShape, Drafted, ModelRunner, StepPlan
from tpserve.kernels.choice import Kernels
from tpserve.model.config import ModelConfig
from tpserve.model.layers import ShardContext

log = logging.getLogger("tpserve.tp")


def dist_timeout() -> datetime.timedelta:
    return datetime.timedelta(seconds=float(os.environ.get("TPSERVE_DIST_TIMEOUT", "600")))


def under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ


def rank_device(device: torch.device, local_rank: int) -> torch.device:
    if device.type != "cuda":
        return device
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


def check_shardable(cfg: ModelConfig, world: int, dtype: torch.dtype) -> None:
    """Build the model on the meta device with `world` ranks: a size that does not split fails here,
    with a message naming it, before any process is started."""
    from tpserve.model.glm5_next import Glm5NextModel

    ctx = ShardContext(0, world, dtype, Communicator(None, torch.device("meta")))
    with torch.device("meta"):
        Glm5NextModel(ctx, cfg)


class RankState:
    """What every rank holds: its groups, communicator and model runner."""

    def __init__(self, rank: int, world: int, local_rank: int, init_method: str | None, ecfg: EngineConfig,
                 model_dir: str, cfg: ModelConfig, device: torch.device, dtype: torch.dtype, kernels: Kernels):
        self.rank, self.world = rank, world
        self.device = rank_device(device, local_rank)
        backend = "nccl" if self.device.type == "cuda" else "gloo"
        kwargs = dict(backend=backend, rank=rank, world_size=world, timeout=dist_timeout())
        if init_method:
            kwargs["init_method"] = init_method
        if backend == "nccl":
            kwargs["device_id"] = self.device
        dist.init_process_group(**kwargs)
        self.comm = None
        try:
            self.control = dist.new_group(backend="gloo", timeout=dist_timeout())
            self.comm = Communicator(dist.group.WORLD, self.device, config=ecfg)
            ctx = ShardContext(rank, world, dtype, self.comm)
            spec = ecfg.speculative
            self.runner = ModelRunner(model_dir, cfg, ctx, self.device, kernels,
                                      progress=None if rank == 0 else False, load_format=ecfg.load_format,
                                      mtp=spec is not None)
            mine = cache_budget(ecfg, cfg, self.device, dtype, world)
            agreed = torch.tensor([mine.num_blocks, mine.num_checkpoints], dtype=torch.long)
            dist.all_reduce(agreed, op=dist.ReduceOp.MIN, group=self.control)
            self.cache_shape = CacheShape(int(agreed[0]), mine.num_slots, mine.block_size, int(agreed[1]))
            self.runner.allocate_cache(self.cache_shape)
            self.runner.setup_graphs(ecfg.max_num_seqs, ecfg.max_model_len, ecfg.enforce_eager,
                                     num_speculative_tokens=0 if spec is None else spec.num_speculative_tokens,
                                     draft_graph=ecfg.draft_graph)
        except BaseException:
            self.close()
            raise

    def receive(self) -> plan_wire.Message | None:
        return plan_wire.receive(self.control)

    def close(self) -> None:
        runner = getattr(self, "runner", None)
        if runner is not None:
            runner.close()  # graphs go before the process group
        if self.comm is not None:
            self.comm.close()
        if dist.is_initialized():
            dist.destroy_process_group()


def worker_loop(state: RankState) -> None:
    """Ranks other than 0: run every step, MTP draft step and KDA commit rank 0 sends until told to stop."""
    try:
        while True:
            msg = state.receive()
            if msg is None:
                break
            if msg.kind == plan_wire.STEP and msg.plan.prev_rows is not None:  # async scheduling
                state.runner.execute(msg.plan, plan_wire.receive_tokens(msg.prev_tokens, state.device))
            elif msg.kind == plan_wire.STEP:
                state.runner.execute(msg.plan)
            elif msg.kind == plan_wire.SPEC:
                state.runner.execute_spec(msg.plan)
            elif msg.kind == plan_wire.COMMIT:
                state.runner.commit(msg.rows)
            else:
                state.runner.draft(msg.plan, msg.rows, msg.kind == plan_wire.DRAFT_MAIN, msg.depths)
    finally:
        state.close()


def _spawned_worker(rank: int, world: int, init_method: str, ecfg: EngineConfig, model_dir: str,
                    cfg: ModelConfig, device: str, dtype: torch.dtype, kernels: Kernels,
                    environ: dict[str, str]) -> None:
    set_environ(environ)
    os.environ["TPSERVE_WORKER"] = "1"
    logging.basicConfig(level=os.environ.get("TPSERVE_LOG_LEVEL", "WARNING"))
    torch.set_num_threads(max(1, torch.get_num_threads() // world))
    state = RankState(rank, world, rank, init_method, ecfg, model_dir, cfg, torch.device(device), dtype, kernels)
    worker_loop(state)


class TPExecutor:
    """Rank 0's side: spawn (or join, under torchrun) the workers, send plans, watch for deaths."""

    def __init__(self, ecfg: EngineConfig, model_dir: str, cfg: ModelConfig, device: torch.device,
                 dtype: torch.dtype, kernels: Kernels):
        self.world_size = ecfg.tensor_parallel_size
        self.procs: list[mp.Process] = []
        self.dead_reason: str | None = None
        self._closed = False
        if device.type == "cuda":
            value, ours = ensure_nccl_cumem()
            log.info("NCCL_CUMEM_ENABLE=%s (%s)", value, "set by tpserve" if ours else "from the environment")
        check_shardable(cfg, self.world_size, dtype)
        if under_torchrun():
            world = int(os.environ["WORLD_SIZE"])
            if world != self.world_size:
                raise ValueError(f"tensor_parallel_size ({self.world_size}) must equal torchrun's WORLD_SIZE ({world})")
            init_method, local_rank = None, int(os.environ.get("LOCAL_RANK", "0"))
        else:
            init_method, local_rank = f"tcp://127.0.0.1:{free_port()}", 0
            if device.type == "cuda" and torch.cuda.device_count() < self.world_size:
                raise ValueError(f"tensor_parallel_size={self.world_size} needs {self.world_size} GPUs, "
                                 f"{torch.cuda.device_count()} visible")
            ctx = mp_context()
            for rank in range(1, self.world_size):
                p = ctx.Process(target=_spawned_worker, name=f"tpserve-rank{rank}", daemon=True,
                                args=(rank, self.world_size, init_method, ecfg, model_dir, cfg, device.type, dtype,
                                      kernels, dict(os.environ)))
                p.start()
                self.procs.append(p)
        try:
            self.state = RankState(0, self.world_size, local_rank, init_method, ecfg, model_dir, cfg, device, dtype,
                                   kernels)
        except Exception:
            self._kill()
            raise
        self.cache_shape = self.state.cache_shape
        self._watch = threading.Thread(target=self._watchdog, name="tpserve-watchdog", daemon=True)
        self._watch.start()

    def _watchdog(self) -> None:
        while not self._closed and self.dead_reason is None:
            for p in self.procs:
                if not p.is_alive() and not self._closed:
                    self.dead_reason = f"tensor-parallel worker {p.name} (pid {p.pid}) exited with code {p.exitcode}"
                    log.error(self.dead_reason)
                    self.state.comm.abort(self.dead_reason)  # unblock a workspace wait in flight
                    if self.state.device.type == "cuda":  # and an NCCL wait (it would never return)
                        abort = getattr(dist.distributed_c10d, "_abort_process_group", None)
                        if abort is not None:
                            try:
                                abort()
                            except Exception as exc:  # noqa: BLE001 - best effort, the engine is dead anyway
                                log.warning("could not abort NCCL: %s", exc)
            time.sleep(0.2)

    def verify_graph_batch(self) -> int | None:
        return self.state.runner.verify_graph_batch()  # every rank captures the same graphs

    def check_alive(self) -> None:
        if self.dead_reason:
            raise EngineDeadError(self.dead_reason)

    def execute(self, plan: StepPlan, prev: torch.Tensor | None = None) -> torch.Tensor:
        """prev: the in-flight step's tokens on this rank's device (async scheduling), sent on to the other
        ranks' devices behind the plan."""
        if prev is None:
            return self._on_every_rank(lambda: plan_wire.send(plan, self.state.control),
                                       lambda: self.state.runner.execute(plan))
        return self._on_every_rank(lambda: plan_wire.send(plan, self.state.control, prev.numel()),
                                   lambda: self.state.runner.execute(plan, plan_wire.send_tokens(prev)))

    def commit(self, counts: list[int]) -> None:
        self._on_every_rank(lambda: plan_wire.broadcast(*plan_wire.encode_commit(counts), self.state.control),
                            lambda: self.state.runner.commit(counts))

    def draft(self, plan: StepPlan, source_rows: list[int], from_main: bool, depths: int = 1) -> Drafted:
        wire = plan_wire.encode_draft(plan, source_rows, from_main, depths)
        return self._on_every_rank(lambda: plan_wire.broadcast(*wire, self.state.control),
                                   lambda: self.state.runner.draft(plan, source_rows, from_main, depths))

    def chain_depths(self, plan: StepPlan | None = None) -> int:
        return self.state.runner.chain_depths(plan)  # every rank captures the same graphs

    def spec_step_limits(self) -> tuple[int, int]:
        return self.state.runner.spec_step_limits()

    def execute_spec(self, plan: StepPlan, while_waiting=None):
        return self._on_every_rank(lambda: plan_wire.broadcast(*plan_wire.encode(plan, plan_wire.SPEC),
                                                               self.state.control),
                                   lambda: self.state.runner.execute_spec(plan, while_waiting))

    def _on_every_rank(self, send, run):
        """Send the work to the other ranks, run it here; a failure marks the executor dead."""
        self.check_alive()
        try:
            send()
            return run()
        except Exception as exc:
            if self.dead_reason is None:  # give the watchdog a moment to name the cause
                time.sleep(0.5)
            raise EngineDeadError(self.dead_reason or f"tensor-parallel step failed: {exc}") from exc

    def _kill(self) -> None:
        for p in self.procs:
            if p.is_alive():
                p.terminate()
        for p in self.procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.dead_reason is None:
            try:
                plan_wire.send(None, self.state.control)
            except Exception as exc:  # a worker already gone: fall through to killing
                log.warning("could not tell workers to stop: %s", exc)
        for p in self.procs:
            p.join(timeout=10)
        self._kill()
        if self.dead_reason is not None:  # peers are gone: tear the groups down without talking to them
            abort = getattr(dist.distributed_c10d, "_abort_process_group", None)
            if abort is not None and self.state.device.type == "cuda":
                abort()
        self.state.close()


def run_torchrun_worker(ecfg: EngineConfig) -> None:
    """Entry of ranks > 0 under torchrun: load the shard and follow rank 0's plans."""
    from tpserve.engine.setup import load_model_config, resolve_runtime

    rt = resolve_runtime(ecfg)
    cfg = load_model_config(ecfg, rt.model_dir)
    if rt.device.type == "cuda":
        ensure_nccl_cumem()
    os.environ["TPSERVE_WORKER"] = "1"
    state = RankState(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", "0")),
                      None, ecfg, str(rt.model_dir), cfg, rt.device, rt.dtype, rt.kernels)
    worker_loop(state)
