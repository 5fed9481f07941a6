"""Slopes (MiB/min, linear fit over t >= 60 s) of a probe JSON, plus first/last values."""
import json, sys
import numpy as np
for path in sys.argv[1:]:
    d = json.load(open(path))
    s = [x for x in d["samples"]]
    t = np.array([x["t"] for x in s])
    m = t >= 60
    print(path, "rc", d["rc"], "trim", d["trim"], "n", len(s))
    for k in ("rss", "heap_in_use", "heap_free", "arena", "mmap", "py_blocks", "traced", "threads"):
        if k not in s[0]:
            continue
        v = np.array([x[k] for x in s], dtype=float)
        p = np.polyfit(t[m], v[m], 1)[0] * 60 if m.sum() > 2 else float("nan")
        print(f"  {k:>12}: first {v[0]:10.1f} at60 {v[m][0]:10.1f} last {v[-1]:10.1f} slope/min {p:10.3f}")
