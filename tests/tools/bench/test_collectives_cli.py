"""`tpserve bench collectives --check` and `tpserve tune collectives` on CPU, world 2."""

from __future__ import annotations

import json

from tpserve.cli import build_parser, main


def test_cli_registers_bench_and_tune():
    parser = build_parser()
    args = parser.parse_args(["bench", "collectives", "--world", "3", "--sizes", "1K:8K",
                              "--check", "--graph"])
    assert args.world == 3 and args.sizes == [1024, 2048, 4096, 8192] and args.check
    args = parser.parse_args(["tune", "collectives", "--out", "x.json", "--sizes", "4K,1M"])
    assert args.out == "x.json" and args.sizes == [4096, 1 << 20]


def test_bench_check_passes_and_prints_a_table(capsys, tmp_path):
    plot = tmp_path / "lat.png"
    rc = main(["bench", "collectives", "--world", "2", "--device", "cpu", "--check",
               "--dtypes", "float32,bfloat16,float16", "--sizes", "4K,2M", "--workspace-mb", "1",
               "--iter-scale", "0.2", "--plot", str(plot), "--json", str(tmp_path / "r.json")])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "check passed" in out
    for op in ("all_reduce", "all_gather", "reduce_scatter"):
        assert f"{op} bfloat16, world 2" in out
    assert "chunked" in out and "oneshot" in out and "pick/torch" in out
    assert "all_reduce_add_rmsnorm bfloat16, world 2" in out and "unfused" in out
    assert "all_reduce_hc_expand bfloat16, world 2" in out
    assert "reduce_scatter_moe_combine bfloat16, world 2" in out
    assert plot.stat().st_size > 1000
    rows = json.loads((tmp_path / "r.json").read_text())["rows"]
    assert {r["op"] for r in rows} == {"all_reduce", "all_gather", "reduce_scatter",
                                       "all_reduce_add_rmsnorm", "all_reduce_hc_expand",
                                       "reduce_scatter_moe_combine"}
    hc = [r for r in rows if r["op"] == "all_reduce_hc_expand"]
    assert all(isinstance(r["us"].get("unfused"), float) for r in hc)
    moe = [r for r in rows if r["op"] == "reduce_scatter_moe_combine"]  # the CPU workspace serves any size
    assert moe and all(isinstance(r["us"].get(p), float) for r in moe for p in ("unfused", "fused"))
    ar = [r for r in rows if r["op"] == "all_reduce"]
    assert all(isinstance(r["us"].get("ring"), float) for r in ar)  # the ring is timed too


def test_bench_check_fails_when_a_path_is_broken(capsys):
    rc = main(["bench", "collectives", "--world", "2", "--device", "cpu", "--check",
               "--no-timing", "--workspace-mb", "1", "--inject-fault", "twoshot"])
    out = capsys.readouterr().out
    assert rc == 1
    assert "CHECK FAILED" in out and "[twoshot]" in out and "mismatch" in out


def test_tune_writes_a_loadable_table(tmp_path, capsys):
    out_path = tmp_path / "tuned.json"
    rc = main(["tune", "collectives", "--world", "2", "--device", "cpu", "--sizes", "1K,256K",
               "--ops", "all_reduce,all_reduce_add_rmsnorm,reduce_scatter_moe_combine", "--iter-scale", "0.2",
               "--out", str(out_path)])
    assert rc == 0
    from tpserve.collectives import tuning
    table = tuning.read_table(out_path)
    assert table.meta["tuned"] is True and table.meta["key"]["world_size"] == 2
    assert table.lookup("all_reduce", "float32", 1024, 2) in ("torch", "oneshot", "twoshot", "ring")
    # no fused add + RMSNorm on the cpu workspace: nothing to choose; the MoE fold is timed both ways
    assert all(r.op != "all_reduce_add_rmsnorm" for r in table.rules)
    rows = {(r["op"], r["bytes"]): r["us"] for r in table.meta["timings"]}
    for size in (1024, 256 << 10):
        us = rows[("reduce_scatter_moe_combine", size)]
        assert table.fuses("reduce_scatter_moe_combine", "float32", size, 2) == (us["fused"] <= us["unfused"])
    assert str(out_path) in capsys.readouterr().out


def test_tune_plot_writes_a_png_of_every_measured_backend(tmp_path, capsys, monkeypatch):
    from tpserve.tools.bench import collectives

    plotted = []
    real_plot = collectives.plot_rows

    def spy(rows, path, title):
        plotted.append(rows)
        real_plot(rows, path, title)

    monkeypatch.setattr(collectives, "plot_rows", spy)
    plot = tmp_path / "tune.png"
    rc = main(["tune", "collectives", "--world", "2", "--device", "cpu", "--sizes", "1K,4K",
               "--ops", "all_reduce,all_gather", "--iter-scale", "0.1",
               "--out", str(tmp_path / "t.json"), "--plot", str(plot)])
    assert rc == 0
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and plot.stat().st_size > 1000
    assert f"plot written to {plot}" in capsys.readouterr().out
    (rows,) = plotted  # the tuner's own measurements, every backend timed
    assert {r["op"] for r in rows} == {"all_reduce", "all_gather"}
    assert {"torch", "oneshot", "twoshot"} <= {b for r in rows for b, us in r["us"].items()
                                                if isinstance(us, float)}


def test_bench_with_the_ring_topology_offers_the_all_reduce_through_neighbours_only(tmp_path, capsys):
    out = tmp_path / "ring.json"
    rc = main(["bench", "collectives", "--world", "3", "--device", "cpu", "--check", "--allreduce-topology", "ring",
               "--sizes", "4K", "--ops", "all_reduce,all_gather", "--iter-scale", "0.2", "--json", str(out)])
    assert rc == 0 and "check passed" in capsys.readouterr().out
    import json
    rows = {r["op"]: r for r in json.loads(out.read_text())["rows"]}
    assert set(rows["all_reduce"]["us"]) == {"torch", "ring"} and rows["all_reduce"]["pick"] == "ring"
    assert set(rows["all_gather"]["us"]) == {"torch"}
