"""bench/boot_snapshot.py on make-tiny widths, on the CPU: a random checkpoint written under the model's own
names in parts with an index, four boots in their own processes (snapshots off, first boot writing one,
restore from the disk, restore again from the page cache), and the restores' sizes and speeds as the snapshot
store logs them."""

from __future__ import annotations

from helpers import load_bench


def test_boot_snapshot_writes_boots_and_restores(tmp_path):
    mod = load_bench("boot_snapshot")
    res = mod.main(["--size", "tiny", "--layers", "KM", "--device", "cpu", "--dir", str(tmp_path)])
    boots = res["boots"]
    assert not boots["off"]["restored"] and not boots["off"]["wrote"]
    assert boots["write"]["wrote"] and not boots["write"]["restored"]
    (gib, seconds, gbps), = boots["restore"]["restored"]
    assert not boots["restore"]["wrote"] and seconds > 0 and gbps == res["restore_gbps"] > 0
    assert abs(gib * 2**30 - res["snapshot_bytes"]) <= 0.01 * 2**30  # (the log rounds to 0.01 GiB)
    (warm_gib, warm_seconds, warm_gbps), = boots["restore_warm"]["restored"]
    assert not boots["restore_warm"]["wrote"] and warm_gib == gib and warm_gbps == res["restore_warm_gbps"] > 0
    assert res["checkpoint_bytes"] == sum(f.stat().st_size for f in (tmp_path / "ckpt").glob("*.safetensors"))
    assert all(boots[k]["phases"].startswith("model and weights") for k in boots)  # the executor's boot log
    assert all(v > 0 for v in res["disk_read_gbps"].values())
