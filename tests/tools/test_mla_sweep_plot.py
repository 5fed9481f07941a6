"""bench/mla_sparse_bench.py --plot --from-json redraws a saved launch-shape sweep without a GPU or Triton."""

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).parents[2] / "bench" / "mla_sparse_bench.py"


def test_plot_from_saved_runs(tmp_path):
    rows = [{"queries": 4096, "config": "h16r32w4sd", "ms": 11.5, "floor_ms": 1.39},
            {"queries": 4096, "config": "h64r64w8s2", "ms": 5.9, "floor_ms": 1.39},
            {"queries": 4096, "config": "h64r64w8s2", "ms": 5.87, "floor_ms": 1.39},   # a repeat: the faster drawn
            {"queries": 4096, "config": "h64r128w8s2", "error": "out of resource: shared memory"},
            {"queries": 256, "config": "h16r32w4sd", "ms": 0.74, "floor_ms": 0.09}]
    src = tmp_path / "sweep.json"
    src.write_text(json.dumps({"rows": rows}))
    png = tmp_path / "sweep.png"
    out = subprocess.run([sys.executable, str(BENCH), "--plot", str(png), "--from-json", str(src)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    bad = subprocess.run([sys.executable, str(BENCH), "--from-json", str(src)], capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode == 2 and "--from-json: give --plot too" in bad.stderr
