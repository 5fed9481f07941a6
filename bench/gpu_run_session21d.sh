#!/usr/bin/env bash
# Twenty-first session, fifth call (~5 min): snapshot restore of one real-width KDA layer with the 288-expert MoE
# (16 GiB) from the disk (page cache dropped, 1.93 GB/s in the thirteenth session, the disk itself 1.3-1.7 GB/s) and,
# new, again with the snapshot's files in the page cache: what the restore reaches when the disk is not the limit
# (issue 11's ">= 3 GB/s per rank").
set -uo pipefail
source bench/gpu_env.sh
free -g | head -2
step "boot with and without a snapshot, restore from disk and from the page cache"
timeout 560 python3 bench/boot_snapshot.py --layers K --json "$OUT/boot_snapshot.json" 2>&1 \
  | tee "$OUT/boot_snapshot.log" | grep -v -i warn | tail -15
step "done"
