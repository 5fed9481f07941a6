"""NCCL's environment in a process: the settings the engine applies before NCCL starts, and
how NCCL's shared-memory segments show up in /proc/PID/numa_maps (read by `tpserve doctor`).

`NCCL_CUMEM_ENABLE`: with cuMem on, NCCL allocates its buffers through the CUDA virtual
memory API (recent NCCL places host-side ones on the NUMA node of the GPU that uses them). With it off (`0`),
NCCL's shared-memory transport uses plain `/dev/shm` files whose pages land wherever the
first touching thread runs, which on a multi-socket host can be the far node: every
intra-node transfer then crosses the socket link, a silent slowdown. We turn it on unless
the user chose a value. `tpserve doctor` checks running processes for the same thing.

NCCL reads the variable when a communicator is first created, so call `ensure_nccl_cumem`
before `torch.distributed.init_process_group` (or anything else that initializes NCCL).

numa_maps lines look like `7f2c3a000000 bind:1 file=/dev/shm/nccl-abc123 dirty=512 N0=12 N1=500
kernelpagesize_kB=4`: policy, then key=value fields and bare flags; `N<node>=` counts resident
pages per node (absent when nothing is resident). File names have space, tab, newline and `=`
escaped as octal, and unlinked files end in ` (deleted)`.
"""

from __future__ import annotations

import os
import re
from collections.abc import MutableMapping
from dataclasses import dataclass, field

CUMEM_VAR = "NCCL_CUMEM_ENABLE"
NCCL_SEGMENT_MARK = "nccl-"  # in the file names of NCCL's /dev/shm segments


def is_unset(value: str | None) -> bool:
    """NCCL treats a missing or empty variable as "use the default"."""
    return value is None or value.strip() == ""


def cumem_disabled(value: str | None) -> bool:
    """True when `value` (of NCCL_CUMEM_ENABLE) switches cuMem off, as NCCL parses it (an
    integer equal to 0). Unset, empty, or any other value is not "off"."""
    if is_unset(value):
        return False
    text = value.strip()
    for base in (0, 10):  # NCCL uses strtoll(base 0); Python's base 0 rejects "010"
        try:
            return int(text, base) == 0
        except ValueError:
            continue
    return False


def ensure_nccl_cumem(environ: MutableMapping[str, str] | None = None) -> tuple[str, bool]:
    """Set NCCL_CUMEM_ENABLE=1 in `environ` (default `os.environ`) unless the user already
    set a non-empty value. Returns (the value in effect, whether we set it)."""
    env = os.environ if environ is None else environ
    current = env.get(CUMEM_VAR)
    if not is_unset(current):
        return current, False
    env[CUMEM_VAR] = "1"
    return "1", True


# -- NCCL's shared-memory segments, as /proc/PID/numa_maps shows them ---------------------------
@dataclass(frozen=True)
class NumaMapping:
    """One line of /proc/PID/numa_maps."""
    address: str
    policy: str
    path: str | None
    pages: dict[int, int] = field(default_factory=dict)  # node -> resident pages
    page_kb: int = 4


def _unescape(path: str) -> str:
    """numa_maps escapes space, tab, newline and '=' in file names as octal (\\040)."""
    text = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), path)
    return text.removesuffix(" (deleted)")  # NCCL unlinks its /dev/shm files once mapped


def parse_numa_maps(text: str) -> list[NumaMapping]:
    """Parse numa_maps lines (`<addr> <policy> [key=value | flag]...`); odd fields are skipped."""
    mappings = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 2:
            continue
        path, pages, page_kb = None, {}, 4
        for item in fields[2:]:
            key, sep, value = item.partition("=")
            if not sep:
                continue  # flags such as heap, stack, huge
            if key == "file":
                path = _unescape(value)
            elif key == "kernelpagesize_kB" and value.isdigit():
                page_kb = int(value)
            elif re.fullmatch(r"N\d+", key) and value.isdigit():
                pages[int(key[1:])] = int(value)
        mappings.append(NumaMapping(fields[0], fields[1], path, pages, page_kb))
    return mappings


def nccl_segments(mappings: list[NumaMapping]) -> dict[str, dict[int, int]]:
    """NCCL shared-memory segments: file name -> resident KiB per node (summed over mappings)."""
    segments: dict[str, dict[int, int]] = {}
    for m in mappings:
        if m.path is None:
            continue
        name = m.path.rsplit("/", 1)[-1]
        if NCCL_SEGMENT_MARK not in name:
            continue
        per_node = segments.setdefault(name, {})
        for node, pages in m.pages.items():
            per_node[node] = per_node.get(node, 0) + pages * m.page_kb
    return segments
