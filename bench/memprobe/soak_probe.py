"""Run `tpserve bench soak` in this process with a sampler thread: RSS, glibc mallinfo2 (bytes in use
vs free in the heap), Python blocks, optionally tracemalloc snapshots (60 s and end) and a periodic
malloc_trim(0). Env: PROBE_OUT (json), PROBE_TRIM (seconds, 0 off), PROBE_TRACE (frames, 0 off)."""
import gc
import json
import os
import sys
import threading
import time
import tracemalloc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from soak_probe_lib import heap, libc, rss  # noqa: E402

out = os.environ.get("PROBE_OUT", "/tmp/probe.json")
trim = float(os.environ.get("PROBE_TRIM", "0"))
frames = int(os.environ.get("PROBE_TRACE", "0"))
samples, snaps = [], {}
stop = threading.Event()
t0 = time.monotonic()


def sampler():
    last_trim = time.monotonic()
    while not stop.wait(5.0):
        now = time.monotonic()
        if trim and now - last_trim >= trim:
            libc.malloc_trim(0)
            last_trim = now
        s = {"t": now - t0, "rss": rss(), **heap(), "py_blocks": sys.getallocatedblocks(),
             "threads": threading.active_count()}
        if frames and tracemalloc.is_tracing():
            s["traced"] = tracemalloc.get_traced_memory()[0] / 2**20
        samples.append(s)


threading.Thread(target=sampler, daemon=True).start()
from tpserve.cli import build_parser  # noqa: E402
import asyncio  # noqa: E402
from tpserve.tools import bench_soak  # noqa: E402

_orig_soak = bench_soak.soak


async def _traced_soak(url, args):
    """tracemalloc from the soak's start; snapshots 60 s in and at the end (server still up)."""
    if not frames:
        return await _orig_soak(url, args)
    tracemalloc.start(frames)

    async def snap(name, delay):
        await asyncio.sleep(delay)
        gc.collect()
        snaps[name] = tracemalloc.take_snapshot()
        snaps[name + "_t"] = time.monotonic() - t0

    tasks = [asyncio.ensure_future(snap("early", 60)), asyncio.ensure_future(snap("late", args.duration - 10))]
    stats = await _orig_soak(url, args)
    await asyncio.gather(*tasks)
    return stats


bench_soak.soak = _traced_soak

if os.environ.get("PROBE_NOCACHE"):  # no BPE word cache in the tokenizer (tokenizers' default: 10,000 words)
    from tpserve.engine import engine as _engine_mod

    _orig_init = _engine_mod.LLMEngine.__init__

    def _init(self, *a, **k):
        _orig_init(self, *a, **k)
        self.tokenizer._tokenizer.model._resize_cache(0)

    _engine_mod.LLMEngine.__init__ = _init

args = build_parser().parse_args(sys.argv[1:])
rc = args.func(args)
stop.set()
result = {"rc": rc, "samples": samples, "argv": sys.argv[1:], "trim": trim, "frames": frames}
if frames and "early" in snaps:
    late = snaps["late"]
    result["snap_t"] = [snaps["early_t"], snaps["late_t"]]
    filt = [tracemalloc.Filter(False, tracemalloc.__file__)]
    for key in ("lineno", "traceback"):
        diff = late.filter_traces(filt).compare_to(snaps["early"].filter_traces(filt), key)
        diff.sort(key=lambda d: -d.size_diff)
        result[f"top_{key}"] = [{"size_diff_kib": d.size_diff / 1024, "count_diff": d.count_diff,
                                 "size_kib": d.size / 1024, "where": [str(f) for f in d.traceback][-frames:]}
                                for d in diff[:40]]
    result["traced_kib"] = [sum(t.size for t in snaps[k].traces) / 1024 for k in ("early", "late")]
json.dump(result, open(out, "w"), indent=1)
print("probe written to", out)
