"""Processed-weight snapshots: each rank's weights after sharding, conversion and quantization,
written on first boot and restored at disk speed on the next.

Layout: <root>/v<FORMAT>-<key hash>/rank<r>-of-<w>.safetensors plus rank<r>-of-<w>.ok (JSON: byte
size, crc32, key), and key.json (the readable key, for `tpserve snapshot list`). The key covers
the checkpoint's fingerprint (config files' bytes; each weight file's name, size and mtime), the TP
layout, dtype, the quantization method and every layer's chosen layout, and LAYOUT_VERSION (bumped
whenever processing changes). Writes go to a temporary file, fsync, rename; the .ok file is
written last. A snapshot whose size, checksum or key does not match is deleted and rebuilt, never
loaded. Entries of another FORMAT are deleted when a store is opened.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import zlib
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

FORMAT = 1
LAYOUT_VERSION = 1
CHUNK = 16 << 20
log = logging.getLogger("tpserve.snapshot")


def default_root() -> Path:
    from tpserve.engine.setup import cache_dir

    return cache_dir() / "snapshots"


def fingerprint(model_dir: str | Path) -> str:
    """The checkpoint's identity: config files by content, weight files by name, size and mtime."""
    from tpserve.model.loader import checkpoint_files

    d = Path(model_dir)
    h = hashlib.sha256()
    for name in ("config.json", "hf_quant_config.json", "model.safetensors.index.json"):
        if (d / name).is_file():
            h.update(name.encode() + b"\0" + (d / name).read_bytes())
    for f in checkpoint_files(d):
        st = f.stat()
        h.update(f"{f.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()


def file_crc(path: Path) -> int:
    crc = 0
    with open(path, "rb", buffering=0) as f:
        while True:
            chunk = f.read(CHUNK)
            if not chunk:
                return crc
            crc = zlib.crc32(chunk, crc)


class SnapshotStore:
    def __init__(self, root: str | Path | None = None):
        self.root = Path(root) if root else default_root()
        self.root.mkdir(parents=True, exist_ok=True)
        for entry in self.root.iterdir():  # other formats: never loadable, deleted
            if entry.is_dir() and not entry.name.startswith(f"v{FORMAT}-") and not entry.name.startswith("."):
                log.info("deleting snapshot %s (format is not v%d)", entry.name, FORMAT)
                shutil.rmtree(entry, ignore_errors=True)

    # ------------------------------------------------------------------ key
    def key(self, model_dir, cfg, ctx, qc, plan: dict[str, str]) -> dict[str, Any]:
        return {"format": FORMAT, "layout_version": LAYOUT_VERSION, "checkpoint": str(Path(model_dir).resolve()),
                "fingerprint": fingerprint(model_dir), "world": ctx.world, "dtype": str(ctx.dtype),
                "num_layers": cfg.num_hidden_layers, "quant": qc.key(),
                "plan": hashlib.sha256(json.dumps(sorted(plan.items())).encode()).hexdigest()}

    def entry_dir(self, key: dict[str, Any]) -> Path:
        digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
        return self.root / f"v{FORMAT}-{digest}"

    @staticmethod
    def _files(entry: Path, rank: int, world: int) -> tuple[Path, Path]:
        stem = f"rank{rank}-of-{world}"
        return entry / f"{stem}.safetensors", entry / f"{stem}.ok"

    # ------------------------------------------------------------------ write
    def write(self, model: nn.Module, key: dict[str, Any], rank: int, world: int) -> Path:
        entry = self.entry_dir(key)
        entry.mkdir(parents=True, exist_ok=True)
        data, ok = self._files(entry, rank, world)
        tensors = {n: p.detach().contiguous().cpu() for n, p in model.named_parameters()}
        _atomic(entry, data, lambda tmp: save_file(tensors, tmp, metadata={"key": json.dumps(key, sort_keys=True)}))
        info = {"bytes": data.stat().st_size, "crc32": file_crc(data), "key": key}
        _atomic(entry, ok, lambda tmp: Path(tmp).write_text(json.dumps(info)))
        if rank == 0:
            _atomic(entry, entry / "key.json", lambda tmp: Path(tmp).write_text(json.dumps(key, indent=1)))
        log.info("rank %d: wrote snapshot %s (%.1f MiB)", rank, entry.name, info["bytes"] / 2**20)
        return data

    # ------------------------------------------------------------------ restore
    def check(self, key: dict[str, Any], rank: int, world: int) -> str | None:
        """None when this rank's snapshot is complete and intact, else why not."""
        data, ok = self._files(self.entry_dir(key), rank, world)
        if not data.is_file() or not ok.is_file():
            return "absent"
        try:
            info = json.loads(ok.read_text())
        except (json.JSONDecodeError, OSError):
            return "unreadable .ok file"
        if info.get("key") != key:
            return "key differs"
        if data.stat().st_size != info.get("bytes"):
            return f"size {data.stat().st_size} != {info.get('bytes')} (truncated?)"
        if file_crc(data) != info.get("crc32"):
            return "checksum mismatch (corrupted)"
        return None

    def restore(self, model: nn.Module, key: dict[str, Any], rank: int, world: int, device: torch.device) -> bool:
        """Fill a meta-device model's parameters from the snapshot; False (after deleting a bad one) if
        there is none to use."""
        why = self.check(key, rank, world)
        data, ok = self._files(self.entry_dir(key), rank, world)
        if why is not None:
            if why != "absent":
                log.warning("rank %d: snapshot %s is not usable (%s); rebuilding it", rank, data, why)
                data.unlink(missing_ok=True)
                ok.unlink(missing_ok=True)
            return False
        tensors = load_file(str(data), device=str(device))
        modules = dict(model.named_modules())
        for name, t in tensors.items():
            mod_name, _, pname = name.rpartition(".")
            mod = modules.get(mod_name)
            if mod is None:
                raise RuntimeError(f"snapshot {data}: tensor {name} has no module in this model (key collision?)")
            mod._parameters[pname] = nn.Parameter(t, requires_grad=False)
        left = [n for n, p in model.named_parameters() if p.is_meta]
        for n in left:  # declared but removed by processing (e.g. a scale folded away)
            mod_name, _, pname = n.rpartition(".")
            del modules[mod_name]._parameters[pname]
        return True


def _atomic(entry: Path, target: Path, write) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=entry)
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def list_snapshots(root: str | Path | None = None) -> list[dict[str, Any]]:
    root = Path(root) if root else default_root()
    out = []
    for entry in sorted(root.iterdir()) if root.is_dir() else []:
        if not entry.is_dir() or entry.name.startswith("."):
            continue
        key = {}
        if (entry / "key.json").is_file():
            key = json.loads((entry / "key.json").read_text())
        size = sum(f.stat().st_size for f in entry.iterdir() if f.is_file())
        ranks = sorted(f.stem for f in entry.glob("rank*.ok"))
        out.append({"id": entry.name, "bytes": size, "ranks": ranks, "key": key})
    return out
