"""`tpserve doctor`: find the host problems that slow tensor parallelism down without an error.

Everything is read from /proc and /sys under `root` (default `/`), so a captured tree can be
checked too. NVML (`pynvml`) is only asked on the live machine (root `/`), never for a tree.

Checks, and the rules behind them:
- `gpus`: NVIDIA GPUs are the PCI devices under sys/bus/pci/devices/ whose `vendor` is 0x10de
  and whose `class` starts with 0x03 (VGA / 3D controller; NVSwitches are bridges and not
  counted). Their NUMA node comes from `numa_node` (-1: unknown). GPU index = position in
  the list sorted by PCI bus id (what CUDA uses with CUDA_DEVICE_ORDER=PCI_BUS_ID, and in
  practice on hosts with one GPU model). No GPU is reported as ok: a CPU host is not broken.
- `numa`: CPU NUMA nodes are the sys/devices/system/node/node<N> with a non-empty `cpulist`.
- `link I-J`: with NVML, per GPU pair: NVLink (direct or through NVSwitch) or the PCIe level
  joining them, and whether peer-to-peer reads are supported. Informational (always ok).
  Without NVML: one `links` check, ok, "NVML not available; links not checked".
- Processes: with `pid` that process; else every running tpserve process, found by its
  cmdline (an argument named `tpserve`, `-m tpserve[.module]`, or python running a .py file
  inside a `tpserve/` directory) or by `TPSERVE_WORKER=1` in its environ. Command lines
  that contain `doctor` (this tool) are skipped. None found: `processes` ok.
- `pid N cumem`: NCCL_CUMEM_ENABLE from /proc/N/environ. Set to 0 on a host with more than
  one CPU NUMA node: warn (NCCL's shared-memory buffers are then plain /dev/shm files placed by
  first touch, not by GPU). Unset: ok, NCCL's default (cuMem on in recent NCCL) applies.
- `pid N gpus`: the process's GPUs: the CUDA_VISIBLE_DEVICES indices if set (all GPUs when it
  holds non-index entries such as UUIDs; parsing stops at a negative or out-of-range index,
  as CUDA does), else all GPUs; then, when LOCAL_RANK is set and in range, only the visible
  GPU at position LOCAL_RANK (the one a worker binds with torch.cuda.set_device).
- `pid N nccl-numa`: NCCL's shared-memory segments are the mappings in /proc/N/numa_maps
  whose file name contains `nccl-`; their resident pages per node come from the `N<node>=`
  fields. FAIL when more than half of a segment's resident memory sits on nodes that none of
  the process's GPUs is attached to. Not judged (ok) when a GPU's node is unknown or the
  process sees no GPU. No NCCL segment at all is healthy (NVLink/P2P and cuMem NCCL use none).
Unreadable environ or numa_maps (another user's process) is a warning: the check was not made.
Exit code: 0 healthy, 1 warnings, 2 failures.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tpserve.collectives.ncclenv import CUMEM_VAR, cumem_disabled, is_unset, nccl_segments, parse_numa_maps

OK, WARN, FAIL = "ok", "warn", "fail"
STATUSES = (OK, WARN, FAIL)  # index = exit code
NVIDIA_VENDOR = "0x10de"
MAX_LISTED = 3  # bad segments named in a detail
MAX_COMMAND = 100  # characters of a command line shown


@dataclass(frozen=True)
class Check:
    name: str
    status: str
    detail: str

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"check {self.name!r}: status must be one of {STATUSES}, got {self.status!r}")

    def to_dict(self) -> dict[str, str]:
        return {"name": self.name, "status": self.status, "detail": self.detail}


@dataclass(frozen=True)
class Gpu:
    index: int
    bus_id: str
    numa_node: int  # -1: unknown

    def describe(self) -> str:
        node = "node unknown" if self.numa_node < 0 else f"node {self.numa_node}"
        return f"GPU {self.index} ({self.bus_id}, {node})"


# -- sysfs ---------------------------------------------------------------------------------------
def _read(path: Path, default: str = "") -> str:
    """A sysfs/proc text file, stripped; `default` when it cannot be read."""
    try:
        return path.read_text(errors="replace").strip()
    except OSError:
        return default


def find_gpus(root: Path) -> list[Gpu]:
    """NVIDIA display/3D PCI devices, sorted by bus id."""
    found = []
    for dev in sorted((root / "sys" / "bus" / "pci" / "devices").glob("*"), key=lambda p: p.name.lower()):
        if _read(dev / "vendor").lower() != NVIDIA_VENDOR or not _read(dev / "class").startswith("0x03"):
            continue
        node = _read(dev / "numa_node", "-1")
        found.append((dev.name.lower(), int(node) if re.fullmatch(r"-?\d+", node) else -1))
    return [Gpu(i, bus, node) for i, (bus, node) in enumerate(found)]


def cpu_nodes(root: Path) -> dict[int, str]:
    """NUMA nodes that have CPUs: node number -> cpulist."""
    nodes = {}
    for entry in (root / "sys" / "devices" / "system" / "node").glob("node*"):
        cpus = _read(entry / "cpulist")
        if re.fullmatch(r"node\d+", entry.name) and cpus:
            nodes[int(entry.name[4:])] = cpus
    return dict(sorted(nodes.items()))


# -- /proc ---------------------------------------------------------------------------------------
def read_cmdline(root: Path, pid: int) -> list[str]:
    raw = (root / "proc" / str(pid) / "cmdline").read_bytes()
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def read_environ(root: Path, pid: int) -> dict[str, str]:
    raw = (root / "proc" / str(pid) / "environ").read_bytes()
    env = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.decode(errors="replace").partition("=")
        if sep and key:
            env[key] = value
    return env


def is_tpserve_argv(argv: list[str]) -> bool:
    """Is this command line a tpserve process? (the rule of the module docstring)"""
    runs_python = bool(argv) and argv[0].rsplit("/", 1)[-1].startswith("python")
    for i, arg in enumerate(argv):
        if arg.rstrip("/").rsplit("/", 1)[-1] == "tpserve":
            return True
        if i > 0 and argv[i - 1] == "-m" and re.fullmatch(r"tpserve(\.\w+)*", arg):
            return True
        if runs_python and arg.endswith(".py") and "tpserve/" in arg:
            return True
    return False


def find_tpserve_processes(root: Path, exclude: tuple[int, ...] = ()) -> list[int]:
    """Pids of running tpserve processes (cmdline or TPSERVE_WORKER=1), doctor runs left out."""
    try:
        pids = sorted(int(p.name) for p in (root / "proc").iterdir() if p.name.isdigit())
    except OSError:
        return []
    found = []
    for pid in pids:
        if pid in exclude:
            continue
        try:
            argv = read_cmdline(root, pid)
        except OSError:
            continue  # exited, or not readable
        if not argv or "doctor" in argv:
            continue
        if not is_tpserve_argv(argv):
            try:
                if read_environ(root, pid).get("TPSERVE_WORKER") != "1":
                    continue
            except OSError:
                continue
        found.append(pid)
    return found


# -- NVML links (live machine only) --------------------------------------------------------------
TOPOLOGY_LEVELS = ((0, "one board"), (10, "one PCIe switch"), (20, "several PCIe switches"),
                   (30, "a PCIe host bridge"), (40, "host bridges of one NUMA node"),
                   (50, "the CPU interconnect (SMP)"))


def _norm_bus(bus: bytes | str) -> str:
    """NVML writes 00000000:17:00.0, sysfs 0000:17:00.0."""
    parts = (bus.decode() if isinstance(bus, bytes) else str(bus)).lower().split(":")
    if len(parts) == 3:
        parts[0] = parts[0][-4:]
    return ":".join(parts)


def link_checks() -> list[Check]:
    """Per GPU pair (NVML index order): NVLink or the PCIe path, and P2P reads. Never raises."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:  # no pynvml, no driver or no libnvidia-ml: a CPU host
        return [Check("links", OK, f"NVML not available; links not checked ({exc})")]
    try:
        return _nvml_pair_checks(pynvml)
    except Exception as exc:  # an NVML error must never crash the doctor
        return [Check("links", OK, f"NVML not available; links not checked (query failed: {exc})")]
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def _nvlink_peers(nvml, handle) -> dict[str, int]:
    """Remote PCI bus id -> number of active NVLinks to it (a GPU, or an NVSwitch)."""
    peers: dict[str, int] = {}
    for link in range(nvml.NVML_NVLINK_MAX_LINKS):
        try:
            if nvml.nvmlDeviceGetNvLinkState(handle, link) != nvml.NVML_FEATURE_ENABLED:
                continue
            bus = _norm_bus(nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId)
        except nvml.NVMLError:
            continue  # no such link on this GPU
        peers[bus] = peers.get(bus, 0) + 1
    return peers


def _nvml_pair_checks(nvml) -> list[Check]:
    handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
    if len(handles) < 2:
        return [Check("links", OK, f"{len(handles)} GPU(s) in NVML: no GPU pair")]
    buses = [_norm_bus(nvml.nvmlDeviceGetPciInfo(h).busId) for h in handles]
    peers = [_nvlink_peers(nvml, h) for h in handles]
    switched = [sum(n for bus, n in p.items() if bus not in buses) for p in peers]
    checks = []
    for i in range(len(handles)):
        for j in range(i + 1, len(handles)):
            if peers[i].get(buses[j]):
                path = f"NVLink x{peers[i][buses[j]]}"
            elif switched[i] and switched[j]:
                path = f"NVLink via NVSwitch (x{min(switched[i], switched[j])})"
            else:
                level = nvml.nvmlDeviceGetTopologyCommonAncestor(handles[i], handles[j])
                path = "PCIe through " + dict(TOPOLOGY_LEVELS).get(level, f"topology level {level}")
            p2p = nvml.nvmlDeviceGetP2PStatus(handles[i], handles[j], nvml.NVML_P2P_CAPS_INDEX_READ)
            p2p_text = "P2P read ok" if p2p == nvml.NVML_P2P_STATUS_OK else "P2P read not supported"
            checks.append(Check(f"link {i}-{j}", OK, f"{path}, {p2p_text}"))
    return checks


# -- checks --------------------------------------------------------------------------------------
def gpu_check(gpus: list[Gpu]) -> Check:
    if not gpus:
        return Check("gpus", OK, "no NVIDIA GPU found in sysfs")
    return Check("gpus", OK, f"{len(gpus)} NVIDIA GPU(s): " + ", ".join(g.describe() for g in gpus))


def numa_check(nodes: dict[int, str]) -> Check:
    if not nodes:
        return Check("numa", OK, "no NUMA information in sysfs (treated as one node)")
    listed = ", ".join(f"node{n} cpus {cpus}" for n, cpus in nodes.items())
    return Check("numa", OK, f"{len(nodes)} CPU node(s): {listed}")


def process_gpus(environ: dict[str, str], gpus: list[Gpu]) -> tuple[list[Gpu], str]:
    """The GPUs a process uses (the rule of the module docstring) and how they were chosen."""
    raw = environ.get("CUDA_VISIBLE_DEVICES")
    visible = list(range(len(gpus)))
    why = "CUDA_VISIBLE_DEVICES unset: all GPUs"
    if raw is not None:
        entries = [e.strip() for e in raw.split(",") if e.strip()]
        if all(re.fullmatch(r"-?\d+", e) for e in entries):
            visible = []
            for e in entries:
                if not 0 <= int(e) < len(gpus):
                    break  # CUDA ignores this entry and everything after it
                visible.append(int(e))
            why = f"CUDA_VISIBLE_DEVICES={raw}"
        else:
            why = f"CUDA_VISIBLE_DEVICES={raw} is not plain GPU indices: assuming all GPUs"
    rank = environ.get("LOCAL_RANK")
    if rank is not None:
        if rank.strip().isdigit() and int(rank) < len(visible):
            visible = [visible[int(rank)]]
            why += f", LOCAL_RANK={rank}"
        else:
            why += f", LOCAL_RANK={rank} ignored (not an index of the {len(visible)} visible GPU(s))"
    chosen = [gpus[i] for i in visible]
    return chosen, why + " -> " + (", ".join(g.describe() for g in chosen) or "no GPU")


def cumem_check(name: str, environ: dict[str, str], n_nodes: int) -> Check:
    value = environ.get(CUMEM_VAR)
    if is_unset(value):
        return Check(name, OK, f"{CUMEM_VAR} unset: NCCL's default applies (cuMem on in recent NCCL)")
    if not cumem_disabled(value):
        return Check(name, OK, f"{CUMEM_VAR}={value}")
    if n_nodes > 1:
        return Check(name, WARN, f"{CUMEM_VAR}={value} on a host with {n_nodes} NUMA nodes: NCCL's "
                     "shared-memory buffers are placed by first touch, not by GPU, and may sit on the "
                     f"far node; unset it or set {CUMEM_VAR}=1")
    return Check(name, OK, f"{CUMEM_VAR}={value} (one NUMA node: harmless)")


def _kib(kib: int) -> str:
    return f"{kib / 1024:.1f} MiB" if kib >= 1024 else f"{kib} KiB"


def placement_check(name: str, segments: dict[str, dict[int, int]], chosen: list[Gpu]) -> Check:
    if not segments:
        return Check(name, OK, "no NCCL shared-memory segment mapped (healthy: NVLink/P2P and cuMem "
                     "NCCL may use none)")
    count = f"{len(segments)} NCCL segment(s)"
    if not chosen:
        return Check(name, OK, f"{count}; the process sees no GPU: placement not judged")
    if any(g.numa_node < 0 for g in chosen):
        return Check(name, OK, f"{count}; GPU NUMA node unknown (numa_node -1): placement not judged")
    gpu_nodes = sorted({g.numa_node for g in chosen})
    total = far = 0
    bad = []
    for seg, per_node in sorted(segments.items()):
        seg_total = sum(per_node.values())
        seg_far = sum(kib for node, kib in per_node.items() if node not in gpu_nodes)
        total, far = total + seg_total, far + seg_far
        if seg_far * 2 > seg_total:
            spread = " ".join(f"N{n}={_kib(k)}" for n, k in sorted(per_node.items()))
            bad.append(f"{seg} ({spread})")
    nodes_text = "node " + ",".join(map(str, gpu_nodes))
    if bad:
        more = len(bad) - MAX_LISTED
        listed = "; ".join(bad[:MAX_LISTED]) + (f"; and {more} more" if more > 0 else "")
        return Check(name, FAIL, f"{len(bad)} of {count} mostly away from the GPU's {nodes_text}: {listed}. "
                     f"Set {CUMEM_VAR}=1, or bind the process to its GPU's node (numactl)")
    near = 100.0 if total == 0 else 100.0 * (total - far) / total
    return Check(name, OK, f"{count}, {_kib(total)} resident, {near:.0f}% on the GPU's {nodes_text}")


def process_checks(root: Path, pid: int, gpus: list[Gpu], n_nodes: int, required: bool = True) -> list[Check]:
    """Checks of one process. `required`: a missing process is a failure (else it just exited)."""
    name = f"pid {pid}"
    try:
        argv = read_cmdline(root, pid)
    except FileNotFoundError:
        if required:
            return [Check(name, FAIL, f"no process {pid} ({root / 'proc' / str(pid)} does not exist)")]
        return [Check(name, OK, "exited while being checked")]
    except OSError as exc:
        return [Check(name, FAIL, f"cannot read its cmdline: {exc}")]
    command = " ".join(argv) or "(no command line)"
    checks = [Check(name, OK, command if len(command) <= MAX_COMMAND else command[:MAX_COMMAND - 3] + "...")]
    try:
        environ = read_environ(root, pid)
    except OSError as exc:
        checks.append(Check(f"{name} environ", WARN, f"cannot read environ ({exc.strerror or exc}); run "
                            "doctor as the process's user or root: cumem not checked, all GPUs assumed"))
        environ = None
    if environ is not None:
        checks.append(cumem_check(f"{name} cumem", environ, n_nodes))
    chosen, why = process_gpus(environ or {}, gpus)
    checks.append(Check(f"{name} gpus", OK, why if environ is not None else "environ unreadable: all GPUs -> "
                        + why.partition(" -> ")[2]))
    try:
        text = (root / "proc" / str(pid) / "numa_maps").read_text(errors="replace")
    except FileNotFoundError:
        checks.append(Check(f"{name} nccl-numa", OK, "no numa_maps (kernel without NUMA): not checked"))
    except OSError as exc:
        checks.append(Check(f"{name} nccl-numa", WARN, f"cannot read numa_maps ({exc.strerror or exc}): "
                            "run doctor as the process's user or root"))
    else:
        checks.append(placement_check(f"{name} nccl-numa", nccl_segments(parse_numa_maps(text)), chosen))
    return checks


def run_doctor(root: Path = Path("/"), pid: int | None = None, nvml: bool | None = None,
               exclude: tuple[int, ...] = ()) -> list[Check]:
    """All checks. `nvml`: query NVML for links (default: only when `root` is `/`).
    `exclude`: pids not to check when scanning (the caller's own)."""
    root = Path(root)
    if nvml is None:
        nvml = root.resolve() == Path("/")
    gpus, nodes = find_gpus(root), cpu_nodes(root)
    n_nodes = max(1, len(nodes))
    checks = [gpu_check(gpus), numa_check(nodes)]
    if nvml:
        checks += link_checks()
    else:
        checks.append(Check("links", OK, f"NVML not queried: checking the captured tree {root}"))
    if pid is not None:
        return checks + process_checks(root, pid, gpus, n_nodes, required=True)
    pids = find_tpserve_processes(root, exclude)
    if not pids:
        return checks + [Check("processes", OK, "no running tpserve process found")]
    checks.append(Check("processes", OK, f"{len(pids)} tpserve process(es): " + ", ".join(map(str, pids))))
    for p in pids:
        checks += process_checks(root, p, gpus, n_nodes, required=False)
    return checks


def exit_code(checks: list[Check]) -> int:
    """0 healthy, 1 warnings, 2 failures."""
    return max((STATUSES.index(c.status) for c in checks), default=0)
