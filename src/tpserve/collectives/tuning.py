"""The size table: which collective backend to use for (op, dtype, size, world size).

A table is an ordered list of rules; the first rule that matches wins:

    {"op": "all_reduce", "dtype": "bfloat16" | "*", "world": 2 | "*",
     "max_bytes": 262144 | null, "backend": "oneshot"}

Sizes are bucketed to the next power of two (`size_bucket`); a rule matches when the bucket is
<= max_bytes (null: no limit). The size of a call is the largest buffer it touches (`op_bytes`):
the tensor for all_reduce, the gathered output for all_gather, the full input for
reduce_scatter (the same convention as nccl-tests). Nothing matching means "torch".

Backends: "torch" (the process group's own collective: NCCL or gloo; "nccl" and "gloo" are
accepted as aliases), "oneshot", "twoshot", "chunked", "ring" (workspace collectives; "ring" is
the neighbour-only all-reduce, all_reduce only), "symm_oneshot",
"symm_twoshot" (torch symmetric-memory ops, CUDA only). Where a chosen backend cannot serve a
call, the Communicator resolves it (see Communicator.backend_for).

The fused collectives (FUSED_OPS: the all-reduce with the residual add + RMSNorm or with the mHC
expand that follows it, the reduce-scatter with the MoE combine as its copy-in) take "fused" or
"unfused"; their size is the partial's bytes (the combined [T, D] rows' for the MoE combine).
Nothing matching means "fused" wherever the workspace serves the call, so a table only needs
rules where `tpserve tune collectives` measured the separate ops faster.

Where tables come from, in order: `EngineConfig.collective_table` (a path), else the cache that
`tpserve tune collectives` writes for this machine (keyed by device, driver, world size,
topology and code version), else the shipped default for the device type
(collectives/default_tables/{cpu,cuda}.json).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import platform
import subprocess
from importlib import resources
from pathlib import Path
from typing import Any

from tpserve import paths

log = logging.getLogger("tpserve.collectives")

OPS = ("all_reduce", "all_gather", "reduce_scatter")
FUSED_OPS = ("all_reduce_add_rmsnorm", "all_reduce_hc_expand", "reduce_scatter_moe_combine")
FUSED, UNFUSED = "fused", "unfused"
TORCH = "torch"
WORKSPACE_BACKENDS = ("oneshot", "twoshot", "chunked", "ring")
SYMM_BACKENDS = ("symm_oneshot", "symm_twoshot")
BACKENDS = (TORCH, *WORKSPACE_BACKENDS, *SYMM_BACKENDS)
ALIASES = {"nccl": TORCH, "gloo": TORCH}
TABLE_FORMAT = 1
_SOURCE_FILES = ("comm.py", "shm.py", "workspace.py", "workspace_group.py", "workspace_peer.py",
                 "workspace_triton.py", "workspace_triton_pipe.py", "workspace_triton_ring.py", "fused.py",
                 "ipc.py", "tuning.py")


def size_bucket(nbytes: int) -> int:
    """The smallest power of two >= nbytes (1 for empty tensors)."""
    return 1 << max(0, int(nbytes) - 1).bit_length()


def op_bytes(op: str, numel: int, itemsize: int, world_size: int) -> int:
    """The size a table is keyed by: the largest buffer of the call (a fused op: its partial)."""
    if op not in OPS + FUSED_OPS:
        raise ValueError(f"unknown collective {op!r}; expected one of {OPS + FUSED_OPS}")
    nbytes = numel * itemsize
    return nbytes * world_size if op == "all_gather" else nbytes


def dtype_name(dtype: Any) -> str:
    """'bfloat16' for torch.bfloat16 (and for the string 'bfloat16')."""
    return str(dtype).removeprefix("torch.")


@dataclasses.dataclass(frozen=True)
class Rule:
    op: str
    dtype: str          # a dtype name or "*"
    world: int | None   # None: any world size
    max_bytes: int | None
    backend: str

    def matches(self, op: str, dtype: str, bucket: int, world: int) -> bool:
        return (self.op == op and self.dtype in ("*", dtype)
                and (self.world is None or self.world == world)
                and (self.max_bytes is None or bucket <= self.max_bytes))

    def to_json(self) -> dict[str, Any]:
        return {"op": self.op, "dtype": self.dtype, "world": "*" if self.world is None else self.world,
                "max_bytes": self.max_bytes, "backend": self.backend}


def _parse_rule(raw: Any, where: str) -> Rule:
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: a rule must be an object, got {raw!r}")
    op, backend = raw.get("op"), ALIASES.get(raw.get("backend"), raw.get("backend"))
    if op not in OPS + FUSED_OPS:
        raise ValueError(f"{where}: op must be one of {OPS + FUSED_OPS}, got {op!r}")
    if op in FUSED_OPS and backend not in (FUSED, UNFUSED):
        raise ValueError(f"{where}: backend of {op} must be {FUSED!r} or {UNFUSED!r}, got {raw.get('backend')!r}")
    if op in OPS and backend not in BACKENDS:
        raise ValueError(f"{where}: backend must be one of {BACKENDS + tuple(ALIASES)}, got "
                         f"{raw.get('backend')!r}")
    world, max_bytes, dtype = raw.get("world", "*"), raw.get("max_bytes"), raw.get("dtype", "*")
    if world != "*" and (not isinstance(world, int) or world < 1):
        raise ValueError(f"{where}: world must be a positive int or '*', got {world!r}")
    if max_bytes is not None and (not isinstance(max_bytes, int) or max_bytes < 1):
        raise ValueError(f"{where}: max_bytes must be a positive int or null, got {max_bytes!r}")
    if not isinstance(dtype, str):
        raise ValueError(f"{where}: dtype must be a string, got {dtype!r}")
    return Rule(op, dtype, None if world == "*" else world, max_bytes, backend)


@dataclasses.dataclass(frozen=True)
class SizeTable:
    rules: tuple[Rule, ...]
    source: str = "<memory>"
    meta: dict = dataclasses.field(default_factory=dict, compare=False)

    def lookup(self, op: str, dtype: Any, nbytes: int, world_size: int) -> str:
        bucket, name = size_bucket(nbytes), dtype_name(dtype)
        for rule in self.rules:
            if rule.matches(op, name, bucket, world_size):
                return rule.backend
        return TORCH

    def fuses(self, op: str, dtype: Any, nbytes: int, world_size: int) -> bool:
        """Whether the fused collective `op` (FUSED_OPS) should run fused: the first matching rule's
        word, "fused" where none matches."""
        bucket, name = size_bucket(nbytes), dtype_name(dtype)
        for rule in self.rules:
            if rule.matches(op, name, bucket, world_size):
                return rule.backend == FUSED
        return True

    def uses_backends(self, world_size: int) -> set[str]:
        """Backends that some rule names for this world size."""
        return {r.backend for r in self.rules if r.world in (None, world_size)}

    def digest(self) -> str:
        """sha256 of the rules alone (notes and timings do not change behaviour)."""
        text = json.dumps([r.to_json() for r in self.rules], sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()

    def to_json(self) -> dict[str, Any]:
        return {"format": TABLE_FORMAT, **{k: v for k, v in self.meta.items() if k != "rules"},
                "rules": [r.to_json() for r in self.rules]}

    @classmethod
    def from_json(cls, data: Any, source: str) -> "SizeTable":
        if not isinstance(data, dict) or not isinstance(data.get("rules"), list):
            raise ValueError(f"{source}: a size table is an object with a 'rules' list")
        if data.get("format", TABLE_FORMAT) != TABLE_FORMAT:
            raise ValueError(f"{source}: table format {data.get('format')} is not {TABLE_FORMAT}")
        rules = tuple(_parse_rule(r, f"{source}: rule {i}") for i, r in enumerate(data["rules"]))
        meta = {k: v for k, v in data.items() if k not in ("rules", "format")}
        return cls(rules, source, meta)


def read_table(path: str | os.PathLike) -> SizeTable:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"collective table {path} does not exist")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON: {exc}") from None
    return SizeTable.from_json(data, str(path))


def write_table(table: SizeTable, path: str | os.PathLike) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(table.to_json(), indent=1) + "\n")
    os.replace(tmp, path)
    return path


def default_table(device_type: str) -> SizeTable:
    name = "cuda.json" if device_type == "cuda" else "cpu.json"
    text = resources.files("tpserve.collectives").joinpath("default_tables", name).read_text()
    return SizeTable.from_json(json.loads(text), f"default:{name}")


# -- the tuned cache ---------------------------------------------------------------------------
def cache_dir() -> Path:
    return paths.cache_dir() / "collectives"


def source_hash() -> str:
    """sha256 (16 hex) of the collectives' source files: a code change invalidates tunings."""
    h = hashlib.sha256()
    here = Path(__file__).parent
    for name in _SOURCE_FILES:
        p = here / name
        h.update(name.encode() + (p.read_bytes() if p.is_file() else b"-"))
    return h.hexdigest()[:16]


def _run(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def machine_key(device_type: str, world_size: int, allreduce_topology: str = "mesh") -> dict[str, Any]:
    """What a tuning is valid for. Computed identically on every rank of one machine. A ring
    workspace (`--allreduce-topology ring`) offers other paths, so its tunings are kept apart."""
    from tpserve import __version__

    key: dict[str, Any] = {"device_type": device_type, "world_size": world_size,
                           "version": __version__, "source_hash": source_hash()}
    if allreduce_topology != "mesh":
        key["allreduce_topology"] = allreduce_topology
    if device_type == "cuda":
        import torch
        key["device"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "?"
        driver = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
        key["driver"] = driver.strip().splitlines()[0] if driver.strip() else "unknown"
        key["cuda"] = str(torch.version.cuda)
        topo = _run(["nvidia-smi", "topo", "-m"])
        key["topology"] = (hashlib.sha256(topo.encode()).hexdigest()[:16] if topo
                           else f"gpus={torch.cuda.device_count()}")
    else:
        model = ""
        try:
            for line in Path("/proc/cpuinfo").read_text().splitlines():
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
        except OSError:
            pass
        key["device"] = model or platform.processor() or platform.machine()
        key["driver"] = platform.release()
        key["topology"] = f"cpu:{os.cpu_count()}"
    return key


def cache_path(key: dict[str, Any]) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir() / f"collectives-{key['device_type']}-w{key['world_size']}-{digest}.json"


def load_table(explicit: str | None, device_type: str, world_size: int,
               allreduce_topology: str = "mesh") -> SizeTable:
    """The table a Communicator uses (see the module docstring for the order)."""
    if explicit:
        return read_table(explicit)
    path = cache_path(machine_key(device_type, world_size, allreduce_topology))
    if path.is_file():
        try:
            return read_table(path)
        except (OSError, ValueError) as exc:
            log.warning("ignoring unreadable tuned collective table %s (%s)", path, exc)
    return default_table(device_type)


def table_from_winners(winners: dict[tuple[str, str, int], str], world_size: int,
                       fallback: SizeTable, meta: dict[str, Any]) -> SizeTable:
    """Rules from measured winners {(op, dtype, bucket): backend}, then the fallback's rules."""
    rules: list[Rule] = []
    items = sorted(winners.items())
    for i, ((op, dt, bucket), backend) in enumerate(items):
        nxt = items[i + 1] if i + 1 < len(items) else None
        if nxt is not None and nxt[0][:2] == (op, dt) and nxt[1] == backend:
            continue  # the next bucket has the same winner: one rule covers both
        rules.append(Rule(op, dt, world_size, bucket, backend))
    # above the largest measured size keep the largest size's winner
    last: dict[tuple[str, str], tuple[int, str]] = {}
    for (op, dt, bucket), backend in winners.items():
        if bucket >= last.get((op, dt), (0, ""))[0]:
            last[(op, dt)] = (bucket, backend)
    rules += [Rule(op, dt, world_size, None, backend) for (op, dt), (_, backend) in sorted(last.items())]
    return SizeTable(tuple(rules) + fallback.rules, "<tuned>", meta)
