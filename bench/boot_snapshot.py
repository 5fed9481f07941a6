"""Boot time with and without a processed-weight snapshot, and the snapshot's restore speed.

    python bench/boot_snapshot.py [--layers K] [--device cuda] [--dir /tmp/tpserve-boot] [--json F]
                                  [--size real|tiny]

Writes a random bf16 checkpoint of GLM-5.3-Flash's real widths with the given layer schedule (default
one KDA layer: embeddings, lm_head and one 288-expert MoE layer, ~16 GB) under --dir, in 4 GiB parts with
an index, unless one is there already. Then boots the engine three times, each in its own process:
  1. snapshots off: the checkpoint loaded and processed (`--no-snapshot`);
  2. snapshots on, none yet: loaded, processed and the snapshot written;
  3. snapshots on: restored from the snapshot;
  4. the same again, the snapshot's files left in the page cache by boot 3: the restore with the disk out of
     the way (what tpserve's own reading, copying and checksums reach; a restart on the same machine).
Before boots 1 and 3 the files they read are dropped from the page cache (posix_fadvise DONTNEED after
fsync: clean pages only, no root needed), so they read from the disk. Prints each boot's seconds (the
engine's constructor: weights, KV cache, graphs off) and the restore's bytes / seconds as the snapshot
store logs it (checksums included), and the disk's ceiling: the snapshot's files read into host memory
with the restore's parallel reads (page cache dropped), one thread and eight. `--size tiny` runs the same on
make-tiny widths (a CPU check).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import save_file
from tqdm import tqdm

PART_BYTES = 4 << 30
THREADS = 8
PHASES = re.compile(r"model and weights [\d.]+ s .*")
RESTORED = re.compile(r"restored ([\d.]+) GiB from snapshot in ([\d.]+) s \(([\d.]+) GB/s")


def write_checkpoint(out: Path, cfg_dict: dict, device: str, seed: int = 0) -> int:
    """Random bf16 tensors under transformers' names for cfg_dict's model, in parts of PART_BYTES; -> bytes."""
    from tpserve.model.config import ModelConfig
    from tpserve.model.tiny import checkpoint_shapes, random_tensors

    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg_dict))
    cfg = ModelConfig.from_dict(cfg_dict)
    total = sum(2 * math.prod(shape) for _, shape in checkpoint_shapes(cfg))
    weight_map, part, size, index = {}, {}, 0, 0

    def flush():
        nonlocal part, size, index
        fname = f"model-{index:05d}.safetensors"
        save_file(part, str(out / fname), metadata={"format": "pt"})
        weight_map.update({n: fname for n in part})
        part, size, index = {}, 0, index + 1

    with tqdm(total=total, unit="B", unit_scale=True, desc="writing a random checkpoint") as bar:
        for name, t in random_tensors(cfg, seed, torch.bfloat16, device):
            part[name] = t.cpu()
            size += t.numel() * 2
            bar.update(t.numel() * 2)
            if size >= PART_BYTES:
                flush()
        if part:
            flush()
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total},
                                                                  "weight_map": weight_map}))
    return total


def evict(paths: list[Path]) -> int:
    """Drop these files' clean pages from the page cache; -> bytes covered."""
    n = 0
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            n += os.fstat(fd).st_size
        finally:
            os.close(fd)
    return n


def disk_read(paths: list[Path], threads: int) -> float:
    """GB/s reading these files (evicted first) into host memory with st_reader's parallel reads: the
    disk's ceiling for a restore (no device copy, no checksums)."""
    from tpserve.model import st_reader

    n = evict(paths)
    start = time.perf_counter()
    for p in paths:
        st_reader.load(p, "cpu", threads=threads)
    return n / 1e9 / (time.perf_counter() - start)


def boot(args) -> None:
    """One boot (the child process): prints a JSON line with its seconds and the restore the store logged."""
    from tpserve import LLM

    lines = []

    class Catch(logging.Handler):
        def emit(self, record):
            lines.append(record.getMessage())
    for name in ("tpserve.snapshot", "tpserve.executor"):  # the restore's GB/s, the boot's phases
        logging.getLogger(name).addHandler(Catch())
        logging.getLogger(name).setLevel(logging.INFO)
    start = time.perf_counter()
    llm = LLM(str(args.dir / "ckpt"), device=args.device, skip_tokenizer_init=True, enforce_eager=True,
              kv_cache_memory=(1 << 30) if args.size == "real" else (64 << 20), max_num_seqs=8, max_model_len=4096,
              snapshot=args.boot != "off", snapshot_dir=str(args.dir / "snapshots"))
    seconds = time.perf_counter() - start
    llm.shutdown()
    restored = [m.groups() for m in map(RESTORED.search, lines) if m]
    phases = [m.group(0) for m in map(PHASES.search, lines) if m]
    print("BOOT " + json.dumps({"seconds": seconds, "restored": [[float(x) for x in g] for g in restored],
                                "phases": phases[-1] if phases else None,
                                "wrote": any("wrote snapshot" in m for m in lines)}), flush=True)


def run_boot(args, mode: str) -> dict:
    cmd = [sys.executable, __file__, "--boot", mode, "--dir", str(args.dir), "--device", args.device,
           "--size", args.size]
    out = subprocess.run(cmd, capture_output=True, text=True)
    found = [line for line in out.stdout.splitlines() if line.startswith("BOOT ")]
    if out.returncode != 0 or not found:
        raise SystemExit(f"boot ({mode}) failed (rc {out.returncode}):\n{out.stderr[-4000:]}")
    return json.loads(found[-1][5:])


def main(argv: list[str] | None = None) -> dict | None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", default="K", help="layer schedule, K (KDA) and M (MLA), as `bench model`")
    ap.add_argument("--size", choices=("real", "tiny"), default="real")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dir", type=Path, default=Path("/tmp/tpserve-boot"))
    ap.add_argument("--json", default=None)
    ap.add_argument("--boot", choices=("off", "on"), default=None, help=argparse.SUPPRESS)  # the child
    args = ap.parse_args(argv)
    if args.boot:
        boot(args)
        return None
    from tpserve.tools.bench.model import real_width_config

    ckpt, snaps = args.dir / "ckpt", args.dir / "snapshots"
    if not (ckpt / "model.safetensors.index.json").is_file():
        write_checkpoint(ckpt, real_width_config(args.layers, False, args.size), args.device)
    if snaps.exists():
        import shutil

        shutil.rmtree(snaps)
    ckpt_files = sorted(ckpt.glob("*.safetensors"))
    ckpt_bytes = evict(ckpt_files)
    rows = {"off": run_boot(args, "off")}
    rows["write"] = run_boot(args, "on")
    parts = sorted(snaps.rglob("*.safetensors"))
    disk = {"1 thread, first part": disk_read(parts[:1], 1), f"{THREADS} threads, all parts": disk_read(parts, THREADS)}
    snap_bytes = evict(parts)
    rows["restore"] = run_boot(args, "on")
    rows["restore_warm"] = run_boot(args, "on")  # boot 3 left the files in the page cache
    if not rows["write"]["wrote"] or not rows["restore"]["restored"] or not rows["restore_warm"]["restored"]:
        raise SystemExit(f"the snapshot was not written and restored: {rows}")
    gib, secs, gbps = rows["restore"]["restored"][0]
    print(f"checkpoint {ckpt_bytes / 2**20:.1f} MiB ({args.layers}, {args.size} widths), snapshot "
          f"{snap_bytes / 2**20:.1f} MiB, device {args.device}")
    print("| boot | seconds | phases |\n| --- | --- | --- |")
    for key, what in (("off", "snapshots off (checkpoint, page cache dropped)"),
                      ("write", "first boot: checkpoint + writing the snapshot"),
                      ("restore", "from the snapshot (page cache dropped)"),
                      ("restore_warm", "from the snapshot (its files in the page cache)")):
        print(f"| {what} | {rows[key]['seconds']:.2f} | {rows[key].get('phases') or ''} |")
    warm_gib, warm_secs, warm_gbps = rows["restore_warm"]["restored"][0]
    print(f"restore: {gib:.2f} GiB in {secs:.2f} s = {gbps:.2f} GB/s from the disk, {warm_secs:.2f} s = "
          f"{warm_gbps:.2f} GB/s from the page cache (checksums included)")
    print("disk read into host memory (page cache dropped): "
          + ", ".join(f"{k} {v:.2f} GB/s" for k, v in disk.items()))
    result = {"layers": args.layers, "size": args.size, "device": args.device, "checkpoint_bytes": ckpt_bytes,
              "snapshot_bytes": snap_bytes, "boots": rows, "restore_gbps": gbps, "restore_warm_gbps": warm_gbps,
              "disk_read_gbps": disk}
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
