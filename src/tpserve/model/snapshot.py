"""Processed-weight snapshots: each rank's weights after sharding, conversion and quantization,
written on first boot and restored at disk speed on the next.

Layout: <root>/v<FORMAT>-<key hash>/rank<r>-of-<w>.<i>.safetensors (parts of at most 2 GiB, so host
memory stays bounded), rank<r>-of-<w>.ok (JSON: each part's byte size, each tensor's checksum, the
key) and key.json (the readable key, for `tpserve snapshot list`). The key covers the checkpoint's
fingerprint (config files' bytes; each weight file's name, size and mtime), the TP layout, dtype,
the quantization method and every layer's chosen layout, random weights' seed (--load-format dummy
with --snapshot), and LAYOUT_VERSION (bumped whenever processing changes). Writes go to a temporary
file, fsync, rename; the .ok file is written last. Too little disk, or a failed write, skips the
snapshot with a warning. Restore reads each file once, in large reads from several threads
(st_reader): sizes are checked first, tensor checksums (summed on the target device) after loading
and before any tensor goes into the model. A snapshot whose key, size or checksum does not match is
deleted and rebuilt, never used. Entries of another FORMAT are deleted when a store is opened.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import nn

from tpserve.model import st_reader
from tpserve.paths import cache_dir

FORMAT = 1
LAYOUT_VERSION = 2  # 2: mHC `fn` stored in fp32
PART_BYTES = 2 << 30  # one safetensors file per 2 GiB of a rank's weights
log = logging.getLogger("tpserve.snapshot")


def default_root() -> Path:
    return cache_dir() / "snapshots"


def fingerprint(model_dir: str | Path) -> str:
    """The checkpoint's identity: config files by content, weight files by name, size and mtime."""
    from tpserve.model.loader import checkpoint_files

    d = Path(model_dir)
    h = hashlib.sha256()
    for name in ("config.json", "hf_quant_config.json", "model.safetensors.index.json"):
        if (d / name).is_file():
            h.update(name.encode() + b"\0" + (d / name).read_bytes())
    weights = (d / "model.safetensors.index.json").is_file() or any(d.glob("*.safetensors"))
    for f in checkpoint_files(d) if weights else []:  # none: random weights (--load-format dummy) of the config
        st = f.stat()
        h.update(f"{f.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()


def tensor_checksum(t: torch.Tensor) -> int:
    """The sum of a tensor's 32-bit words (bytes if its size is not a multiple of 4) in int64,
    computed where the tensor lives (on a GPU at memory speed): any changed word changes it."""
    b = t.detach().contiguous().reshape(-1).view(torch.uint8)
    w = b.view(torch.int32) if b.numel() % 4 == 0 else b
    return int(w.sum(dtype=torch.int64))


class SnapshotStore:
    def __init__(self, root: str | Path | None = None):
        self.root = Path(root) if root else default_root()
        self.root.mkdir(parents=True, exist_ok=True)
        for entry in self.root.iterdir():  # other formats: never loadable, deleted
            if entry.is_dir() and not entry.name.startswith(f"v{FORMAT}-") and not entry.name.startswith("."):
                log.info("deleting snapshot %s (format is not v%d)", entry.name, FORMAT)
                shutil.rmtree(entry, ignore_errors=True)

    # ------------------------------------------------------------------ key
    def key(self, model_dir, cfg, ctx, qc, plan: dict[str, str], merged: bool = False,
            dummy_seed: int | None = None) -> dict[str, Any]:
        """merged: model/merged.py stacked the weights of linears that share an input (`--merge-linears`);
        dummy_seed: the seed of random weights (`--load-format dummy`), None for a checkpoint's."""
        key = {"format": FORMAT, "layout_version": LAYOUT_VERSION, "merged": merged,
               "checkpoint": str(Path(model_dir).resolve()),
               "fingerprint": fingerprint(model_dir), "world": ctx.world, "dtype": str(ctx.dtype),
               "num_layers": cfg.num_hidden_layers, "quant": qc.key(),
               "config": hashlib.sha256(json.dumps(dataclasses.asdict(cfg), sort_keys=True,
                                                   default=str).encode()).hexdigest(),  # hf_overrides too
               "plan": hashlib.sha256(json.dumps(sorted(plan.items())).encode()).hexdigest()}
        if dummy_seed is not None:
            key["dummy_seed"] = dummy_seed
        return key

    def entry_dir(self, key: dict[str, Any]) -> Path:
        digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
        return self.root / f"v{FORMAT}-{digest}"

    @staticmethod
    def _ok_file(entry: Path, rank: int, world: int) -> Path:
        return entry / f"rank{rank}-of-{world}.ok"

    @staticmethod
    def _part(entry: Path, rank: int, world: int, i: int) -> Path:
        return entry / f"rank{rank}-of-{world}.{i:04d}.safetensors"

    # ------------------------------------------------------------------ write
    def write(self, model: nn.Module, key: dict[str, Any], rank: int, world: int) -> bool:
        """Write this rank's parameters in parts of at most PART_BYTES (so host memory stays bounded);
        skipped with a warning when the disk is too small or a write fails (the boot goes on)."""
        entry = self.entry_dir(key)
        params = list(model.named_parameters())
        need = sum(p.numel() * p.element_size() for _, p in params)
        try:
            entry.mkdir(parents=True, exist_ok=True)
            free = shutil.disk_usage(entry).free
            if free < need * 1.05 + (1 << 20):
                log.warning("rank %d: no snapshot written: it needs %.1f GiB, %s has %.1f GiB free", rank,
                            need / 2**30, entry, free / 2**30)
                return False
            parts, chunk, size, sums = [], {}, 0, {}
            for name, p in params + [("", None)]:
                if p is not None:
                    chunk[name] = p.detach().contiguous().cpu()
                    sums[name] = tensor_checksum(p)
                    size += p.numel() * p.element_size()
                if chunk and (p is None or size >= PART_BYTES):
                    path = self._part(entry, rank, world, len(parts))
                    _atomic(entry, path, lambda tmp: save_file(chunk, tmp, metadata={"key": json.dumps(key, sort_keys=True)}))
                    parts.append({"file": path.name, "bytes": path.stat().st_size,
                                  "sums": {n: sums.pop(n) for n in chunk}})
                    chunk, size = {}, 0
            info = {"parts": parts, "key": key}
            _atomic(entry, self._ok_file(entry, rank, world), lambda tmp: Path(tmp).write_text(json.dumps(info)))
            if rank == 0:
                _atomic(entry, entry / "key.json", lambda tmp: Path(tmp).write_text(json.dumps(key, indent=1)))
        except OSError as exc:
            log.warning("rank %d: snapshot write failed (%s); booting without it", rank, exc)
            self._remove(entry, rank, world)
            return False
        log.info("rank %d: wrote snapshot %s (%.1f MiB in %d parts)", rank, entry.name, need / 2**20, len(parts))
        return True

    def _remove(self, entry: Path, rank: int, world: int) -> None:
        self._ok_file(entry, rank, world).unlink(missing_ok=True)
        for f in entry.glob(f"rank{rank}-of-{world}.*.safetensors"):
            f.unlink(missing_ok=True)

    # ------------------------------------------------------------------ restore
    def check(self, key: dict[str, Any], rank: int, world: int) -> str | None:
        """None when this rank's snapshot is complete and intact, else why not."""
        entry = self.entry_dir(key)
        ok = self._ok_file(entry, rank, world)
        if not ok.is_file():
            return "absent"
        try:
            info = json.loads(ok.read_text())
        except (json.JSONDecodeError, OSError):
            return "unreadable .ok file"
        if info.get("key") != key:
            return "key differs"
        for part in info.get("parts", []):
            path = entry / part["file"]
            if not path.is_file():
                return f"{path.name} missing"
            if path.stat().st_size != part["bytes"]:
                return f"{path.name}: size {path.stat().st_size} != {part['bytes']} (truncated?)"
        return None if info.get("parts") else "no parts"

    def restore(self, model: nn.Module, key: dict[str, Any], rank: int, world: int, device: torch.device) -> bool:
        """Fill a meta-device model's parameters from the snapshot; False (after deleting a bad one) if
        there is none to use."""
        entry = self.entry_dir(key)
        why = self.check(key, rank, world) if entry.is_dir() else "absent"
        if why is not None:
            if why != "absent":
                log.warning("rank %d: snapshot %s is not usable (%s); rebuilding it", rank, entry, why)
                self._remove(entry, rank, world)
            elif entry.is_dir():
                self._remove(entry, rank, world)  # parts without their .ok: an interrupted write
            return False
        info = json.loads(self._ok_file(entry, rank, world).read_text())
        start = time.perf_counter()
        tensors: dict[str, torch.Tensor] = {}
        for part in info["parts"]:  # every tensor loaded and checked before any goes into the model
            try:
                loaded = st_reader.load(entry / part["file"], device)
            except (st_reader.SafetensorsError, OSError) as exc:
                loaded, why = None, f"{part['file']}: unreadable ({exc})"
            if loaded is not None:
                bad = [n for n, t in loaded.items() if part["sums"].get(n) != tensor_checksum(t)]
                bad += sorted(set(part["sums"]) - set(loaded))
                why = f"{part['file']}: checksum mismatch in {bad[:3]} (corrupted)" if bad else None
            if why is not None:
                log.warning("rank %d: snapshot %s is not usable (%s); rebuilding it", rank, entry, why)
                self._remove(entry, rank, world)
                return False
            tensors.update(loaded)
        modules = dict(model.named_modules())
        for name, t in tensors.items():
            mod_name, _, pname = name.rpartition(".")
            mod = modules.get(mod_name)
            if mod is None:
                raise RuntimeError(f"snapshot {entry}: tensor {name} has no module in this model (key collision?)")
            mod._parameters[pname] = nn.Parameter(t, requires_grad=False)
        left = [n for n, p in model.named_parameters() if p.is_meta]
        for n in left:  # declared but removed by processing (e.g. kv_b_proj's scale after dequantization)
            mod_name, _, pname = n.rpartition(".")
            del modules[mod_name]._parameters[pname]
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds, nbytes = time.perf_counter() - start, sum(part["bytes"] for part in info["parts"])
        log.info("rank %d: restored %.2f GiB from snapshot in %.4f s (%.3f GB/s, checksums included)", rank,
                 nbytes / 2**30, seconds, nbytes / 1e9 / max(seconds, 1e-9))
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
