"""One engine replica: a `tpserve serve` process of its own (with its --tp ranks) on a local port, its GPUs,
its output relayed line by line with a `[replica i]` prefix, and waiting for its /health."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

import httpx

from tpserve.config import EngineConfig

# serve's own flags a replica takes over as they are (the host, port and fleet flags are the fleet's)
SERVE_FLAGS = {"served_model_name": "--served-model-name", "metrics_public": "--metrics-public",
               "max_request_bytes": "--max-request-bytes", "drain_timeout": "--drain-timeout",
               "malloc_trim_interval": "--malloc-trim-interval", "log_level": "--log-level"}


class ReplicaError(RuntimeError):
    pass


@dataclass
class Replica:
    index: int
    port: int
    gpus: list[str] | None  # CUDA_VISIBLE_DEVICES of its ranks; None on the CPU
    proc: subprocess.Popen | None = None
    started_at: float = 0.0  # wall clock of the current process's start
    restarts: int = 0
    state: str = "new"  # starting, serving, draining, stopped, failed
    busy: threading.Lock = field(default_factory=threading.Lock)  # held while a restart works on it

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def name(self) -> str:
        return str(self.index)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def info(self) -> dict:
        return {"replica": self.name, "url": self.url, "pid": self.proc.pid if self.proc else None,
                "state": self.state, "started_at": self.started_at, "restarts": self.restarts, "gpus": self.gpus}


def snapshots_wanted(snapshot: bool | None, load_format: str | None) -> bool:
    """Whether the replicas keep weight snapshots: --snapshot / --no-snapshot as given, else on (the first replica
    writes one, the rest and every restart restore it), except for random weights (--load-format dummy)."""
    return snapshot if snapshot is not None else load_format != "dummy"


def replica_argv(args, port: int, snapshots: bool | None = None) -> list[str]:
    """The `tpserve serve` command line of one replica: the model and every engine flag given to the fleet,
    serve's own flags, snapshots on where `snapshots` (default: `snapshots_wanted` of the flags) says so: a restart
    then restores processed weights instead of loading them."""
    argv = [sys.executable, "-m", "tpserve.cli", "serve"]
    model = getattr(args, "model", None) or getattr(args, "model_flag", None)
    if model:
        argv.append(model)
    for f in dataclasses.fields(EngineConfig):
        value = getattr(args, f.name, None)
        if f.name == "model" or value is None:
            continue
        flag = EngineConfig.flag_name(f)
        if isinstance(value, bool):
            argv.append(flag if value else f"--no-{flag[2:]}")
        else:
            argv += [flag, str(value)]
    if snapshots is None:
        snapshots = snapshots_wanted(getattr(args, "snapshot", None), getattr(args, "load_format", None))
    if getattr(args, "snapshot", None) is None and snapshots:
        argv.append("--snapshot")
    for name, flag in SERVE_FLAGS.items():
        value = getattr(args, name, None)
        if value is None or value is False:
            continue
        if value is True:
            argv.append(flag)
        elif isinstance(value, list):
            argv += [flag, *value]
        else:
            argv += [flag, str(value)]
    return argv + ["--host", "127.0.0.1", "--port", str(port)]


def visible_gpus() -> list[str]:
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [g.strip() for g in listed.split(",") if g.strip() and g.strip() != "-1"]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


def gpu_groups(replicas: int, tp: int, device: str | None, utilization: float = 0.85) -> list[list[str] | None]:
    """Each replica's GPUs: the visible ones (CUDA_VISIBLE_DEVICES's list, else 0..n-1) split in order into
    groups of `tp`; None for every replica on the CPU. A GPU listed twice (CUDA_VISIBLE_DEVICES=0,0) is shared,
    so its replicas' --gpu-memory-utilization must add up to at most 1."""
    if device == "cpu":
        return [None] * replicas
    gpus = visible_gpus()
    if not gpus:
        if device == "cuda":
            raise ReplicaError("--device cuda: no GPU is visible")
        return [None] * replicas
    need = replicas * tp
    if len(gpus) < need:
        raise ReplicaError(f"--data-parallel-size {replicas} x --tp {tp} needs {need} GPUs; {len(gpus)} are "
                           f"visible ({','.join(gpus)})")
    groups = [gpus[i * tp:(i + 1) * tp] for i in range(replicas)]
    for gpu in set(gpus[:need]):
        sharing = sum(gpu in group for group in groups)
        if sharing * utilization > 1.0:
            raise ReplicaError(f"GPU {gpu} is shared by {sharing} replicas: --gpu-memory-utilization {utilization:g} "
                               f"x {sharing} > 1; pass at most {int(100 / sharing) / 100:g}")
    return groups


def start(replica: Replica, argv: list[str], env: dict[str, str]) -> None:
    """Start the replica's process (in its own session, so its TP ranks go down with it: killpg)."""
    env = dict(env)
    if replica.gpus is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(replica.gpus)
    replica.proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, start_new_session=True)
    replica.started_at, replica.state = time.time(), "starting"
    threading.Thread(target=relay, args=(replica.proc.stdout, f"[replica {replica.index}] "), daemon=True).start()


def relay(stream, prefix: str, quiet=None) -> None:
    """Copy a child's output to our stderr, each line prefixed (those `quiet` picks dropped)."""
    for raw in iter(stream.readline, b""):
        line = raw.decode("utf-8", "replace")
        if quiet is not None and quiet(line):
            continue
        sys.stderr.write(prefix + line)
        sys.stderr.flush()
    stream.close()


def wait_until_answers(url: str, alive, timeout: float, interval: float,
                       stop: threading.Event | None = None) -> bool:
    """GET `url` every `interval` s until it answers 200 (True); False once `alive()` turns false, `timeout`
    passes or `stop` is set."""
    deadline = time.monotonic() + timeout
    with httpx.Client(timeout=2.0) as client:
        while time.monotonic() < deadline and not (stop and stop.is_set()):
            if not alive():
                return False
            try:
                if client.get(url).status_code == 200:
                    return True
            except httpx.HTTPError:
                pass
            time.sleep(interval)
    return False


def wait_healthy(replica: Replica, timeout: float, stop: threading.Event | None = None) -> None:
    """Wait until /health answers 200; ReplicaError if the process exits or `timeout` passes first."""
    if wait_until_answers(replica.url + "/health", replica.alive, timeout, 0.25, stop):
        return
    if not replica.alive():
        code = replica.proc.returncode if replica.proc else None
        raise ReplicaError(f"replica {replica.index} exited (code {code}) before it was healthy")
    raise ReplicaError(f"replica {replica.index} was not healthy within {timeout:.0f} s")


def warm_up(replica: Replica, api_key: str | None) -> None:
    """One short request straight to the replica before it rejoins (its first request pays no lazy setup)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    with httpx.Client(timeout=120.0) as client:
        r = client.post(replica.url + "/v1/completions", headers=headers,
                        json={"prompt": "warm up", "max_tokens": 1})
    if r.status_code != 200:
        raise ReplicaError(f"replica {replica.index}: warm-up request answered {r.status_code}: {r.text[:200]}")


def stop(replica: Replica, timeout: float) -> int | None:
    """SIGTERM (the replica drains its running requests), then SIGKILL of its process group after `timeout`."""
    proc = replica.proc
    if proc is None:
        return None
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            kill(replica)
    kill(replica)  # TP ranks left behind, if any
    return proc.wait()


def kill(replica: Replica) -> None:
    try:
        os.killpg(replica.proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
