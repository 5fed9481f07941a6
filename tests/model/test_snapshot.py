"""Processed-weight snapshots: restore is bit-identical (weights and logits); a changed knob gets a
new key; corrupted, truncated and other-format snapshots are detected and rebuilt, never loaded."""

import json

import pytest
import torch

from tpserve.kernels.choice import Kernels, WeightOptions
from tpserve.model import snapshot as snap
from tpserve.model.build import build_model
from tpserve.model.config import ModelConfig
from tpserve.model.layers import ShardContext
from tpserve.tools.quantize import quantize_checkpoint


def _build(path, root, **opts):
    kernels = Kernels(weights=WeightOptions(snapshot=True, snapshot_dir=str(root), **opts))
    return build_model(path, ModelConfig.from_file(path), ShardContext.single(torch.float32), torch.device("cpu"),
                       kernels)


def _meta(path):
    from tpserve.model.build import plan_model

    cfg = ModelConfig.from_file(path)
    return plan_model(path, cfg, ShardContext.single(torch.float32), Kernels())[0]


def _same(a, b):
    pa, pb = dict(a.named_parameters()), dict(b.named_parameters())
    assert pa.keys() == pb.keys()
    for n in pa:
        assert pa[n].dtype == pb[n].dtype and pa[n].shape == pb[n].shape, n
        assert torch.equal(pa[n].view(torch.uint8), pb[n].view(torch.uint8)), n


@pytest.fixture(scope="module")
def ckpt(tiny, tmp_path_factory):
    return quantize_checkpoint(tiny("default"), tmp_path_factory.mktemp("snap") / "fp8", "fp8", block=16)


def test_restore_is_bit_identical(ckpt, tmp_path, monkeypatch):
    from helpers import prefill_logits
    from tpserve import LLM

    monkeypatch.setattr(snap, "PART_BYTES", 256 << 10)  # several parts, as a real model's 2 GiB parts
    kw = dict(device="cpu", kv_cache_memory="8MiB", block_size=16, snapshot=True, snapshot_dir=str(tmp_path))
    first = LLM(str(ckpt), **kw)
    entries = snap.list_snapshots(tmp_path)
    assert len(entries) == 1 and entries[0]["ranks"] == ["rank0-of-1"]
    assert len(list((tmp_path / entries[0]["id"]).glob("rank0-of-1.*.safetensors"))) > 2
    calls = []
    real = snap.SnapshotStore.restore
    snap.SnapshotStore.restore = lambda self, *a: calls.append(real(self, *a)) or calls[-1]
    try:
        again = LLM(str(ckpt), **kw)
    finally:
        snap.SnapshotStore.restore = real
    assert calls == [True]
    _same(first.engine.executor.runner.model, again.engine.executor.runner.model)
    prompt = list(range(5, 40))
    assert torch.equal(prefill_logits(first, prompt), prefill_logits(again, prompt))


def test_knobs_change_the_key(ckpt, tmp_path):
    _build(ckpt, tmp_path)
    _build(ckpt, tmp_path, dense_fp8=True)  # a different processed layout: a new entry, never the old one
    assert len(snap.list_snapshots(tmp_path)) == 2
    cfg = ModelConfig.from_file(ckpt)
    store = snap.SnapshotStore(tmp_path)
    from tpserve.model.quant_config import QuantConfig

    k1 = store.key(ckpt, cfg, ShardContext.single(torch.float32), QuantConfig("fp8", (16, 16)), {"a": "fp8"})
    k2 = store.key(ckpt, cfg, ShardContext.single(torch.bfloat16), QuantConfig("fp8", (16, 16)), {"a": "fp8"})
    k3 = store.key(ckpt, cfg, ShardContext.single(torch.float32), QuantConfig("fp8", (16, 16)), {"a": "bf16"})
    assert len({store.entry_dir(k).name for k in (k1, k2, k3)}) == 3
    (ckpt / "config.json").write_text((ckpt / "config.json").read_text() + " ")  # the checkpoint changed
    assert store.entry_dir(store.key(ckpt, cfg, ShardContext.single(torch.float32), QuantConfig("fp8", (16, 16)),
                                     {"a": "fp8"})) != store.entry_dir(k1)


def test_random_weights_snapshot_only_when_asked_and_keyed_by_seed(ckpt, tmp_path):
    def build(seed, snapshot=True):
        kernels = Kernels(weights=WeightOptions(snapshot=snapshot, snapshot_dir=str(tmp_path)))
        return build_model(ckpt, ModelConfig.from_file(ckpt), ShardContext.single(torch.float32),
                           torch.device("cpu"), kernels, load_format="dummy", seed=seed)

    from tpserve.config import EngineConfig
    from tpserve.model.build import weight_options

    assert not weight_options(EngineConfig(load_format="dummy"), torch.device("cuda")).snapshot
    assert weight_options(EngineConfig(load_format="dummy", snapshot=True), torch.device("cuda")).snapshot
    first = build(7)
    assert len(snap.list_snapshots(tmp_path)) == 1
    _same(first, build(7))  # restored: the same random weights
    assert len(snap.list_snapshots(tmp_path)) == 1
    other = build(8)  # another seed: its own entry, other weights
    assert len(snap.list_snapshots(tmp_path)) == 2
    assert not torch.equal(first.embed_tokens.weight, other.embed_tokens.weight)
    _same(other, build(8, snapshot=False))


def test_random_weights_of_a_config_only_folder_snapshot(tiny, tmp_path):
    """--load-format dummy needs no weight files, and neither does its snapshot: the config is the identity."""
    import shutil

    folder = tmp_path / "config-only"
    folder.mkdir()
    shutil.copy(tiny("default") / "config.json", folder / "config.json")
    key = snap.fingerprint(folder)
    kernels = Kernels(weights=WeightOptions(snapshot=True, snapshot_dir=str(tmp_path / "snaps")))

    def build():
        return build_model(folder, ModelConfig.from_file(folder), ShardContext.single(torch.float32),
                           torch.device("cpu"), kernels, load_format="dummy", seed=3)

    _same(build(), build())
    assert len(snap.list_snapshots(tmp_path / "snaps")) == 1
    cfg = json.loads((folder / "config.json").read_text())
    cfg.setdefault("text_config", cfg)["rms_norm_eps"] = 1e-5 + 1e-9
    (folder / "config.json").write_text(json.dumps(cfg))
    assert snap.fingerprint(folder) != key


@pytest.mark.parametrize("damage", ["flip", "truncate", "ok-missing"])
def test_damaged_snapshot_is_rebuilt_not_loaded(ckpt, tmp_path, damage):
    first = _build(ckpt, tmp_path)
    entry = tmp_path / snap.list_snapshots(tmp_path)[0]["id"]
    data = sorted(entry.glob("rank0-of-1.*.safetensors"))[-1]
    raw = bytearray(data.read_bytes())
    if damage == "flip":
        raw[-100] ^= 0xFF                      # inside the last tensor's data
        data.write_bytes(bytes(raw))
    elif damage == "truncate":
        data.write_bytes(bytes(raw[:len(raw) // 2]))
    else:
        (entry / "rank0-of-1.ok").unlink()
    store = snap.SnapshotStore(tmp_path)
    key = json.loads((entry / "key.json").read_text())
    # a flipped byte keeps the size (found by the tensor checksums after loading); the others by check()
    assert (store.check(key, 0, 1) is None) == (damage == "flip")
    restored = []
    real = snap.SnapshotStore.restore
    snap.SnapshotStore.restore = lambda self, *a: restored.append(real(self, *a)) or restored[-1]
    try:
        again = _build(ckpt, tmp_path)
    finally:
        snap.SnapshotStore.restore = real
    assert restored == [False]                 # the damaged snapshot was not used
    _same(first, again)                        # the checkpoint was loaded instead
    assert store.check(key, 0, 1) is None      # and the snapshot rewritten
    assert store.restore(_meta(ckpt), key, 0, 1, torch.device("cpu"))


def test_other_format_versions_are_deleted(ckpt, tmp_path):
    old = tmp_path / "v0-0123456789"
    old.mkdir()
    (old / "rank0-of-1.safetensors").write_bytes(b"x")
    _build(ckpt, tmp_path)
    assert not old.exists()


def test_snapshot_cli_list_and_rm(ckpt, tmp_path, capsys):
    from tpserve.cli import main

    _build(ckpt, tmp_path)
    assert main(["snapshot", "list", "--snapshot-dir", str(tmp_path)]) == 0
    ident = snap.list_snapshots(tmp_path)[0]["id"]
    assert ident in capsys.readouterr().out
    assert main(["snapshot", "rm", ident, "--snapshot-dir", str(tmp_path)]) == 0
    assert snap.list_snapshots(tmp_path) == []


def test_a_failed_write_does_not_stop_the_boot(ckpt, tmp_path, monkeypatch):
    def full_disk(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(snap, "save_file", full_disk)
    model = _build(ckpt, tmp_path)
    assert model.layers[3].mlp.experts.gate_up_proj.dtype == torch.float8_e4m3fn
    assert all(not e["ranks"] for e in snap.list_snapshots(tmp_path))
