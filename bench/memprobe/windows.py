"""Means of RSS / heap fields over [60,120) and [240,300+) s of a probe JSON and their difference."""
import json, sys
import numpy as np
for path in sys.argv[1:]:
    d = json.load(open(path)); s = d["samples"]
    t = np.array([x["t"] for x in s])
    t0 = t[np.argmax(np.array([x["threads"] for x in s]) >= 9)]  # server up
    a = (t >= t0 + 60) & (t < t0 + 120); b = (t >= t0 + 240)
    row = []
    for k in ("rss", "heap_in_use", "heap_free", "arena", "mmap"):
        v = np.array([x[k] for x in s])
        row.append(f"{k} {v[a].mean():.1f}->{v[b].mean():.1f} ({v[b].mean()-v[a].mean():+.1f})")
    print(path.split('/')[-1], "trim", d["trim"], "| " + " | ".join(row))
