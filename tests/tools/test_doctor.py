"""`tpserve doctor` on captured /proc + /sys trees built in tmp_path, and `ensure_nccl_cumem`."""

from __future__ import annotations

import json
import os
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tpserve import cli
from tpserve.tools import doctor_checks as doctor
from tpserve.tools.doctor_checks import FAIL, OK, WARN, Check, exit_code, run_doctor
from tpserve.collectives.ncclenv import cumem_disabled, ensure_nccl_cumem, nccl_segments, parse_numa_maps

FIXTURES = Path(__file__).parent / "fixtures" / "doctor"
TWO_GPUS = (("0000:17:00.0", 0), ("0000:65:00.0", 1))
TPSERVE_ARGV = ("/usr/bin/python3", "/opt/venv/bin/tpserve", "serve", "--tp", "2")


def nccl_maps(n0: int, n1: int, name: str = "nccl-a1b2c3") -> str:
    """numa_maps of a worker with one NCCL segment (n0/n1 resident pages on node 0/1)."""
    return (f"55d0c8a00000 default file=/usr/bin/python3.11 mapped=180 N0=180 kernelpagesize_kB=4\n"
            f"7f2c3a000000 default file=/dev/shm/{name}\\040(deleted) dirty={n0 + n1} N0={n0} N1={n1} "
            f"kernelpagesize_kB=4\n"
            f"7ffd1a2b3000 default stack anon=33 dirty=33 N0=33 kernelpagesize_kB=4\n")


@dataclass
class Proc:
    pid: int = 1234
    argv: tuple[str, ...] = TPSERVE_ARGV
    env: dict[str, str] = field(default_factory=lambda: {"PATH": "/usr/bin"})
    numa_maps: str | None = ""


def write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def make_tree(tmp_path: Path, nodes: int = 2, gpus=TWO_GPUS, procs=()) -> Path:
    """A minimal captured host: CPU nodes, PCI devices (GPUs plus non-GPU noise), processes."""
    root = tmp_path / "host"
    for n in range(nodes):
        write_bytes(root / f"sys/devices/system/node/node{n}/cpulist", f"{32 * n}-{32 * n + 31}\n".encode())
    write_bytes(root / "sys/devices/system/node/online", f"0-{nodes - 1}\n".encode())
    pci = root / "sys/bus/pci/devices"
    devices = [(bus, "0x10de", "0x030200", node) for bus, node in gpus]
    devices += [("0000:00:00.0", "0x8086", "0x060000", 0),   # Intel host bridge
                ("0000:c1:00.0", "0x10de", "0x068000", 1),   # NVSwitch: a bridge, not a GPU
                ("0000:31:00.0", "0x15b3", "0x020700", 0)]   # a NIC
    for bus, vendor, cls, node in devices:
        for name, value in (("vendor", vendor), ("class", cls), ("numa_node", str(node))):
            write_bytes(pci / bus / name, f"{value}\n".encode())
    write_bytes(root / "proc/1/cmdline", b"/sbin/init\0")
    write_bytes(root / "proc/1/environ", b"HOME=/\0")
    for p in procs:
        base = root / "proc" / str(p.pid)
        write_bytes(base / "cmdline", b"".join(a.encode() + b"\0" for a in p.argv))
        write_bytes(base / "environ", b"".join(f"{k}={v}".encode() + b"\0" for k, v in p.env.items()))
        if p.numa_maps is not None:
            write_bytes(base / "numa_maps", p.numa_maps.encode())
    return root


def by_name(checks: list[Check]) -> dict[str, Check]:
    return {c.name: c for c in checks}


# -- the four cases doctor tells apart -------------------------------------------------------------
def test_healthy_host(tmp_path):
    env = {"CUDA_VISIBLE_DEVICES": "0,1", "LOCAL_RANK": "1", "NCCL_CUMEM_ENABLE": "1"}
    root = make_tree(tmp_path, procs=[Proc(env=env, numa_maps=nccl_maps(4, 508))])
    checks = by_name(run_doctor(root))
    assert exit_code(list(checks.values())) == 0
    assert "GPU 1 (0000:65:00.0, node 1)" in checks["pid 1234 gpus"].detail
    assert "99% on the GPU's node 1" in checks["pid 1234 nccl-numa"].detail
    assert checks["processes"].detail.endswith("1234")


def test_nccl_pages_on_far_node_fail(tmp_path):
    env = {"CUDA_VISIBLE_DEVICES": "0", "NCCL_CUMEM_ENABLE": "1"}
    root = make_tree(tmp_path, procs=[Proc(env=env, numa_maps=nccl_maps(12, 500))])
    checks = run_doctor(root)
    assert exit_code(checks) == 2
    placement = by_name(checks)["pid 1234 nccl-numa"]
    assert placement.status == FAIL
    assert "nccl-a1b2c3" in placement.detail and "node 0" in placement.detail
    assert "(deleted)" not in placement.detail


def test_cumem_off_on_two_nodes_warns(tmp_path):
    env = {"NCCL_CUMEM_ENABLE": "0", "LOCAL_RANK": "0"}
    root = make_tree(tmp_path, procs=[Proc(env=env, numa_maps=nccl_maps(500, 0))])
    checks = run_doctor(root)
    assert exit_code(checks) == 1
    cumem = by_name(checks)["pid 1234 cumem"]
    assert cumem.status == WARN and "2 NUMA nodes" in cumem.detail


def test_no_nccl_segments_is_healthy(tmp_path):
    maps = "7ffd1a2b3000 default stack anon=33 dirty=33 N0=30 N1=3 kernelpagesize_kB=4\n"
    root = make_tree(tmp_path, procs=[Proc(env={"CUDA_VISIBLE_DEVICES": "0"}, numa_maps=maps)])
    checks = by_name(run_doctor(root))
    assert exit_code(list(checks.values())) == 0
    assert checks["pid 1234 nccl-numa"].detail.startswith("no NCCL shared-memory segment")
    assert "unset" in checks["pid 1234 cumem"].detail


# -- more rules ----------------------------------------------------------------------------------
def test_cumem_off_on_single_node_host_is_ok(tmp_path):
    root = make_tree(tmp_path, nodes=1, gpus=(("0000:17:00.0", 0),),
                     procs=[Proc(env={"NCCL_CUMEM_ENABLE": "0"}, numa_maps=nccl_maps(64, 0))])
    checks = run_doctor(root)
    assert exit_code(checks) == 0
    assert "one NUMA node" in by_name(checks)["pid 1234 cumem"].detail


def test_unknown_gpu_node_is_not_judged(tmp_path):
    root = make_tree(tmp_path, gpus=(("0000:17:00.0", -1),), procs=[Proc(numa_maps=nccl_maps(0, 64))])
    placement = by_name(run_doctor(root))["pid 1234 nccl-numa"]
    assert placement.status == OK and "not judged" in placement.detail


def test_pages_split_across_gpu_nodes_ok(tmp_path):
    # no CUDA_VISIBLE_DEVICES, no LOCAL_RANK: both GPUs, so both nodes are near
    root = make_tree(tmp_path, procs=[Proc(numa_maps=nccl_maps(10, 90))])
    assert by_name(run_doctor(root))["pid 1234 nccl-numa"].status == OK


def test_process_gpus_rule():
    two = [doctor.Gpu(0, "0000:17:00.0", 0), doctor.Gpu(1, "0000:65:00.0", 1)]
    assert doctor.process_gpus({}, two)[0] == two
    assert doctor.process_gpus({"CUDA_VISIBLE_DEVICES": "1,0", "LOCAL_RANK": "0"}, two)[0] == [two[1]]
    assert doctor.process_gpus({"CUDA_VISIBLE_DEVICES": "1,7,0"}, two)[0] == [two[1]]  # stops at 7
    assert doctor.process_gpus({"CUDA_VISIBLE_DEVICES": ""}, two)[0] == []
    chosen, why = doctor.process_gpus({"CUDA_VISIBLE_DEVICES": "GPU-8f1e2d"}, two)
    assert chosen == two and "assuming all GPUs" in why
    chosen, why = doctor.process_gpus({"CUDA_VISIBLE_DEVICES": "0", "LOCAL_RANK": "3"}, two)
    assert chosen == [two[0]] and "ignored" in why


def test_gpus_found_in_sysfs(tmp_path):
    root = make_tree(tmp_path, gpus=(("0000:65:00.0", 1), ("0000:17:00.0", 0)))
    gpus = doctor.find_gpus(root)
    assert [(g.bus_id, g.numa_node) for g in gpus] == [("0000:17:00.0", 0), ("0000:65:00.0", 1)]
    assert [g.index for g in gpus] == [0, 1]
    assert doctor.cpu_nodes(root) == {0: "0-31", 1: "32-63"}


def test_missing_pid_fails_cleanly(tmp_path):
    root = make_tree(tmp_path)
    checks = run_doctor(root, pid=4242)
    assert exit_code(checks) == 2
    missing = by_name(checks)["pid 4242"]
    assert missing.status == FAIL and "no process 4242" in missing.detail


def test_no_process_found_reports_host_checks(tmp_path):
    checks = by_name(run_doctor(make_tree(tmp_path, procs=[Proc(pid=77, argv=("vim", "tpserve.toml"))])))
    assert list(checks) == ["gpus", "numa", "links", "processes"]
    assert checks["processes"] == Check("processes", OK, "no running tpserve process found")
    assert "NVML not queried" in checks["links"].detail


def test_process_scan(tmp_path):
    procs = [Proc(pid=10, argv=("python", "-m", "tpserve.tools.serve"), numa_maps=None),
             Proc(pid=11, argv=("python", "worker.py"), env={"TPSERVE_WORKER": "1"}),
             Proc(pid=12, argv=("/opt/venv/bin/python", "/opt/venv/bin/tpserve", "doctor")),
             Proc(pid=13, argv=("bash", "-c", "ls /srv/tpserve-cache")),
             Proc(pid=14, argv=("python3", "/src/tpserve/cli.py", "serve"))]
    root = make_tree(tmp_path, procs=procs)
    assert doctor.find_tpserve_processes(root) == [10, 11, 14]
    assert doctor.find_tpserve_processes(root, exclude=(10,)) == [11, 14]
    checks = by_name(run_doctor(root))
    assert "not checked" in checks["pid 10 nccl-numa"].detail  # no numa_maps: kernel without NUMA


def test_unreadable_environ_warns(tmp_path):
    root = make_tree(tmp_path, procs=[Proc(numa_maps=nccl_maps(0, 64))])
    environ = root / "proc/1234/environ"
    environ.unlink()
    environ.mkdir()  # reading it fails like a permission error would
    checks = by_name(run_doctor(root, pid=1234))
    assert checks["pid 1234 environ"].status == WARN
    assert "pid 1234 cumem" not in checks
    assert checks["pid 1234 gpus"].detail.startswith("environ unreadable: all GPUs -> GPU 0")


def test_check_rejects_bad_status():
    with pytest.raises(ValueError, match="status"):
        Check("x", "bad", "")


# -- numa_maps parsing ---------------------------------------------------------------------------
def test_parse_captured_numa_maps():
    mappings = parse_numa_maps((FIXTURES / "numa_maps_two_nodes.txt").read_text())
    assert len(mappings) == 11  # the one-word line is skipped
    assert mappings[3].policy == "bind:1" and mappings[3].path == "/dev/shm/nccl-abc123"
    assert mappings[3].pages == {0: 12, 1: 500}
    assert mappings[5].pages == {} and mappings[1].path is None
    assert mappings[-1].pages == {}  # malformed N fields are ignored
    segments = nccl_segments(mappings)
    assert segments == {"nccl-abc123": {0: 48, 1: 2000}, "nccl-def456": {0: 128, 1: 128},
                        "nccl-ghi789": {}, "nccl-huge01": {0: 4096}}


# -- NVML ----------------------------------------------------------------------------------------
class FakeNvml(types.ModuleType):
    """Two GPUs joined by 4 direct NVLinks; a third on PCIe only."""
    NVML_NVLINK_MAX_LINKS, NVML_FEATURE_ENABLED = 6, 1
    NVML_P2P_CAPS_INDEX_READ, NVML_P2P_STATUS_OK = 0, 0
    NVMLError = RuntimeError
    BUSES = ("00000000:17:00.0", "00000000:65:00.0", "00000000:CA:00.0")

    def __init__(self):
        super().__init__("pynvml")
        self.shut = False

    def nvmlInit(self): pass
    def nvmlShutdown(self): self.shut = True
    def nvmlDeviceGetCount(self): return 3
    def nvmlDeviceGetHandleByIndex(self, i): return i
    def nvmlDeviceGetPciInfo(self, h): return types.SimpleNamespace(busId=self.BUSES[h].encode())

    def nvmlDeviceGetNvLinkState(self, h, link):
        if h == 2 or link >= 4:
            raise self.NVMLError("not supported")
        return 1

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h, link):
        return types.SimpleNamespace(busId=self.BUSES[1 - h])

    def nvmlDeviceGetTopologyCommonAncestor(self, a, b): return 50
    def nvmlDeviceGetP2PStatus(self, a, b, cap): return 0 if 2 not in (a, b) else 2


def test_links_from_nvml(monkeypatch):
    fake = FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    checks = by_name(doctor.link_checks())
    assert checks["link 0-1"].detail == "NVLink x4, P2P read ok"
    assert checks["link 0-2"].detail == "PCIe through the CPU interconnect (SMP), P2P read not supported"
    assert fake.shut


def test_nvml_failures_never_crash(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    [check] = doctor.link_checks()
    assert check.status == OK and check.detail.startswith("NVML not available; links not checked")
    fake = FakeNvml()
    fake.nvmlDeviceGetCount = lambda: (_ for _ in ()).throw(RuntimeError("driver gone"))
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    [check] = doctor.link_checks()
    assert check.status == OK and "driver gone" in check.detail and fake.shut


def test_root_never_queries_nvml(tmp_path, monkeypatch):
    fake = FakeNvml()
    fake.nvmlInit = lambda: pytest.fail("NVML queried for a captured tree")
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    assert cli.main(["doctor", "--root", str(make_tree(tmp_path))]) == 0


# -- CLI -----------------------------------------------------------------------------------------
def test_cli_json(tmp_path, capsys):
    env = {"NCCL_CUMEM_ENABLE": "0"}
    root = make_tree(tmp_path, procs=[Proc(env=env, numa_maps=nccl_maps(12, 500))])
    code = cli.main(["doctor", "--root", str(root), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 1 and set(out) == {"checks"}
    assert all(set(c) == {"name", "status", "detail"} for c in out["checks"])
    assert {c["status"] for c in out["checks"]} == {"ok", "warn"}


def test_cli_text_and_missing_pid(tmp_path, capsys):
    root = make_tree(tmp_path)
    assert cli.main(["doctor", "--root", str(root), "--pid", "999"]) == 2
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["STATUS", "CHECK", "DETAIL"]
    assert out[-1] == "result: 1 failure(s), 0 warning(s) (exit 2)"
    assert any(line.startswith("fail    pid 999") for line in out)


# -- ensure_nccl_cumem ---------------------------------------------------------------------------
def test_ensure_nccl_cumem():
    env: dict[str, str] = {}
    assert ensure_nccl_cumem(env) == ("1", True) and env == {"NCCL_CUMEM_ENABLE": "1"}
    assert ensure_nccl_cumem({"NCCL_CUMEM_ENABLE": "0"}) == ("0", False)
    env = {"NCCL_CUMEM_ENABLE": " "}
    assert ensure_nccl_cumem(env) == ("1", True) and env["NCCL_CUMEM_ENABLE"] == "1"


def test_ensure_nccl_cumem_defaults_to_os_environ(monkeypatch):
    monkeypatch.setenv("NCCL_CUMEM_ENABLE", "")  # so that monkeypatch restores the variable after
    monkeypatch.delenv("NCCL_CUMEM_ENABLE")
    assert ensure_nccl_cumem() == ("1", True) and os.environ["NCCL_CUMEM_ENABLE"] == "1"


@pytest.mark.parametrize("value, off", [(None, False), ("", False), ("0", True), (" 0 ", True),
                                        ("00", True), ("0x0", True), ("1", False), ("2", False),
                                        ("no", False)])
def test_cumem_disabled(value, off):
    assert cumem_disabled(value) is off
