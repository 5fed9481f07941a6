"""The size table: buckets, lookups, validation, shipped defaults, the tuned cache."""

from __future__ import annotations

import json

import pytest
import torch

from tpserve.collectives import tuning
from tpserve.collectives.tuning import Rule, SizeTable


def table(*rules: tuple) -> SizeTable:
    return SizeTable(tuple(Rule(*r) for r in rules))


def test_size_bucket_is_the_next_power_of_two():
    assert [tuning.size_bucket(n) for n in (0, 1, 2, 3, 4, 5, 4096, 4097)] == \
        [1, 1, 2, 4, 4, 8, 4096, 8192]


def test_op_bytes_uses_the_largest_buffer():
    assert tuning.op_bytes("all_reduce", 10, 2, 4) == 20
    assert tuning.op_bytes("all_gather", 10, 2, 4) == 80
    assert tuning.op_bytes("reduce_scatter", 12, 2, 4) == 24
    with pytest.raises(ValueError, match="unknown collective"):
        tuning.op_bytes("broadcast", 1, 1, 2)


def test_first_matching_rule_wins():
    t = table(("all_reduce", "bfloat16", 2, 1024, "oneshot"),
              ("all_reduce", "*", None, 1 << 20, "twoshot"),
              ("all_gather", "*", 4, None, "chunked"))
    assert t.lookup("all_reduce", torch.bfloat16, 1000, 2) == "oneshot"
    assert t.lookup("all_reduce", torch.bfloat16, 1025, 2) == "twoshot"  # bucket 2048
    assert t.lookup("all_reduce", torch.float32, 1000, 2) == "twoshot"
    assert t.lookup("all_reduce", "bfloat16", 1000, 3) == "twoshot"
    assert t.lookup("all_reduce", torch.float32, (1 << 20) + 1, 2) == "torch"  # no rule
    assert t.lookup("all_gather", torch.float32, 1 << 30, 4) == "chunked"
    assert t.lookup("all_gather", torch.float32, 1, 2) == "torch"


def test_aliases_and_validation():
    t = SizeTable.from_json({"rules": [{"op": "all_reduce", "max_bytes": 8, "backend": "nccl"}]},
                            "x")
    assert t.rules[0].backend == "torch" and t.rules[0].world is None and t.rules[0].dtype == "*"
    for bad, msg in [({"op": "broadcast", "backend": "torch"}, "op must be"),
                     ({"op": "all_reduce", "backend": "magic"}, "backend must be"),
                     ({"op": "all_reduce", "backend": "torch", "world": 0}, "world must be"),
                     ({"op": "all_reduce", "backend": "torch", "max_bytes": -1}, "max_bytes")]:
        with pytest.raises(ValueError, match=msg):
            SizeTable.from_json({"rules": [bad]}, "t.json")
    with pytest.raises(ValueError, match="rules"):
        SizeTable.from_json({"nope": 1}, "t.json")
    with pytest.raises(ValueError, match="format"):
        SizeTable.from_json({"format": 99, "rules": []}, "t.json")


def test_fused_ops_take_fused_or_unfused_and_fuse_where_no_rule_says_otherwise():
    t = SizeTable.from_json({"rules": [{"op": "all_reduce_hc_expand", "dtype": "bfloat16", "max_bytes": 1024,
                                        "backend": "unfused"},
                                       {"op": "reduce_scatter_moe_combine", "world": 4, "backend": "unfused"}]}, "t")
    assert not t.fuses("all_reduce_hc_expand", torch.bfloat16, 1000, 2)
    assert t.fuses("all_reduce_hc_expand", torch.bfloat16, 1025, 2)  # bucket 2048: no rule
    assert t.fuses("all_reduce_hc_expand", torch.float32, 1000, 2)
    assert t.fuses("all_reduce_add_rmsnorm", torch.bfloat16, 1000, 2)
    assert not t.fuses("reduce_scatter_moe_combine", torch.float32, 1 << 30, 4)
    assert t.fuses("reduce_scatter_moe_combine", torch.float32, 1 << 30, 2)
    assert tuning.op_bytes("all_reduce_hc_expand", 10, 2, 4) == 20
    for bad, msg in [({"op": "all_reduce_hc_expand", "backend": "oneshot"}, "must be 'fused' or 'unfused'"),
                     ({"op": "all_reduce", "backend": "fused"}, "backend must be")]:
        with pytest.raises(ValueError, match=msg):
            SizeTable.from_json({"rules": [bad]}, "t.json")


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_shipped_defaults_load_and_prefer_custom_paths_for_small_sizes(device):
    t = tuning.default_table(device)
    assert t.meta.get("tuned") is False and "note" in t.meta
    for world in (2, 4, 8):
        assert t.lookup("all_reduce", torch.bfloat16, 8 << 10, world) == "oneshot"
        assert t.lookup("all_gather", torch.bfloat16, 64 << 10, world) != "torch"
        assert t.lookup("reduce_scatter", torch.bfloat16, 64 << 10, world) != "torch"


def test_digest_ignores_notes_but_not_rules():
    a = SizeTable.from_json({"note": "a", "rules": [{"op": "all_reduce", "backend": "oneshot"}]}, "a")
    b = SizeTable.from_json({"note": "b", "rules": [{"op": "all_reduce", "backend": "oneshot"}]}, "b")
    c = SizeTable.from_json({"rules": [{"op": "all_reduce", "backend": "twoshot"}]}, "c")
    assert a.digest() == b.digest() != c.digest()


def test_write_read_round_trip(tmp_path):
    t = table(("all_reduce", "float32", 2, 4096, "oneshot"), ("all_gather", "*", None, None, "torch"))
    path = tuning.write_table(SizeTable(t.rules, meta={"note": "hi"}), tmp_path / "d" / "t.json")
    back = tuning.read_table(path)
    assert back.rules == t.rules and back.meta["note"] == "hi"
    with pytest.raises(FileNotFoundError):
        tuning.read_table(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        tuning.read_table(tmp_path / "bad.json")


def test_load_table_order_explicit_then_cache_then_default(tmp_path, monkeypatch):
    monkeypatch.setenv("TPSERVE_CACHE_DIR", str(tmp_path / "cache"))
    assert tuning.load_table(None, "cpu", 2).source == "default:cpu.json"
    key = tuning.machine_key("cpu", 2)
    assert key["world_size"] == 2 and key["topology"].startswith("cpu:") and key["source_hash"]
    path = tuning.cache_path(key)
    assert path.parent == tmp_path / "cache" / "collectives"
    tuned = table(("all_reduce", "*", 2, None, "twoshot"))
    tuning.write_table(tuned, path)
    assert tuning.load_table(None, "cpu", 2).rules == tuned.rules
    assert tuning.load_table(None, "cpu", 3).source == "default:cpu.json"  # other world size
    path.write_text("garbage")
    assert tuning.load_table(None, "cpu", 2).source == "default:cpu.json"  # unreadable: warn
    explicit = tuning.write_table(table(("all_reduce", "*", None, None, "oneshot")),
                                  tmp_path / "mine.json")
    assert tuning.load_table(str(explicit), "cpu", 2).rules[0].backend == "oneshot"
    with pytest.raises(FileNotFoundError):
        tuning.load_table(str(tmp_path / "nope.json"), "cpu", 2)


def test_ring_tunings_are_cached_apart_from_mesh_ones(tmp_path, monkeypatch):
    monkeypatch.setenv("TPSERVE_CACHE_DIR", str(tmp_path))
    mesh, ring = tuning.machine_key("cpu", 3), tuning.machine_key("cpu", 3, "ring")
    assert tuning.cache_path(mesh) != tuning.cache_path(ring) and "allreduce_topology" not in mesh
    tuning.write_table(table(("all_reduce", "*", None, None, "ring")), tuning.cache_path(ring))
    assert tuning.load_table(None, "cpu", 3, "ring").rules[0].backend == "ring"
    assert tuning.load_table(None, "cpu", 3).source == "default:cpu.json"


def test_table_from_winners_buckets_and_extends_the_largest_size():
    fallback = table(("all_gather", "*", None, None, "torch"))
    t = tuning.table_from_winners({("all_reduce", "float32", 1024): "oneshot",
                                   ("all_reduce", "float32", 1 << 20): "twoshot"}, 2, fallback,
                                  {"tuned": True})
    assert t.lookup("all_reduce", torch.float32, 100, 2) == "oneshot"
    assert t.lookup("all_reduce", torch.float32, 5000, 2) == "twoshot"
    assert t.lookup("all_reduce", torch.float32, 1 << 30, 2) == "twoshot"
    assert t.lookup("all_reduce", torch.float32, 100, 4) == "torch"
    assert json.loads(json.dumps(t.to_json()))["tuned"] is True
    t = tuning.table_from_winners({("all_reduce_hc_expand", "bfloat16", 1024): "unfused",
                                   ("all_reduce_hc_expand", "bfloat16", 1 << 16): "fused"}, 2, fallback, {})
    assert not t.fuses("all_reduce_hc_expand", torch.bfloat16, 100, 2)
    assert t.fuses("all_reduce_hc_expand", torch.bfloat16, 5000, 2)
    assert t.fuses("all_reduce_hc_expand", torch.bfloat16, 1 << 30, 2)
