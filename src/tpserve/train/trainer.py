"""`tpserve train-demo OUT`: train the small glm5_next (main model + MTP head) and export it.

OUT/data.xz, data.json   packed token rows (made here unless present: corpus + BPE)
OUT/model/               the checkpoint: config.json, generation_config.json, tokenizer, safetensors
OUT/state.pt             resume state (weights, AdamW, step, losses), written every `save_every` steps
OUT/loss.png             the loss curves; OUT/model/train_info.json the settings, steps and time

Seeded: the init, the batch order (a permutation per epoch from the seed) and the corpus depend
only on the settings, so a CPU run is bit-for-bit reproducible (CUDA index_add is not).
Steps: `steps` if given, else as many as `time_budget` seconds allow, measured on steps 3..7 and
then fixed (and recorded, so a rerun with that `steps` gives the same schedule). `stop_after`
ends this call early (state saved and a checkpoint exported), for runs split over several calls.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from tpserve.model.config import ModelConfig
from tpserve.train import presets
from tpserve.train.model import TrainModel, init_weights_
from tpserve.train.settings import TrainSettings

SHARD_BYTES = 15 * 2**20  # safetensors shards small enough to copy back from a device run


def lr_at(s: TrainSettings, step: int, total: int) -> float:
    if step < s.warmup:
        return s.lr * (step + 1) / s.warmup
    frac = min(1.0, (step - s.warmup) / max(1, total - s.warmup))
    return s.lr * (s.min_lr_frac + (1 - s.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * frac)))


class Batches:
    """Rows for step s: a fresh permutation of all rows per epoch, seeded by (seed, epoch)."""

    def __init__(self, rows: torch.Tensor, batch: int, seed: int):
        self.rows, self.batch, self.seed = rows, batch, seed
        self.perms: dict[int, torch.Tensor] = {}

    def __call__(self, step: int) -> torch.Tensor:
        n = self.rows.shape[0]
        idx = []
        for k in range(step * self.batch, (step + 1) * self.batch):
            epoch = k // n
            if epoch not in self.perms:
                self.perms = {epoch: torch.randperm(n, generator=torch.Generator().manual_seed(self.seed * 1000 + epoch))}
            idx.append(int(self.perms[epoch][k % n]))
        return self.rows[idx].long()


def losses(model: TrainModel, ids: torch.Tensor, s: TrainSettings) -> tuple[torch.Tensor, dict]:
    out = model(ids.clamp(min=0), mtp_depths=s.mtp_depths, aux=s.indexer_weight > 0)
    vocab = out.logits.shape[-1]
    main = F.cross_entropy(out.logits[:, :-1].reshape(-1, vocab), ids[:, 1:].reshape(-1), ignore_index=-1)
    parts = {"main": main}
    total = main
    if out.mtp_logits:
        mtp = []
        for d, logits in enumerate(out.mtp_logits, start=1):
            mtp.append(F.cross_entropy(logits[:, :-(d + 1)].reshape(-1, vocab), ids[:, d + 1:].reshape(-1),
                                       ignore_index=-1))
            parts[f"mtp{d}"] = mtp[-1]
        total = total + s.mtp_weight * torch.stack(mtp).mean()
    if out.indexer_losses:
        parts["indexer"] = torch.stack(out.indexer_losses).mean()
        total = total + s.indexer_weight * parts["indexer"]
    return total, {"loads": out.loads, **parts}


@torch.no_grad()
def balance_(loads: list, rate: float) -> None:
    """Auxiliary-loss-free balancing: raise the bias of under-used experts, lower the over-used."""
    per_router: dict[int, list] = {}
    for router, counts in loads:
        per_router.setdefault(id(router), [router, torch.zeros_like(counts)])[1] += counts
    for router, counts in per_router.values():
        c = counts.float()
        router.e_score_correction_bias += rate * torch.sign(c.mean() - c)


def _device(s: TrainSettings) -> torch.device:
    if s.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(s.device)


def train(out: str | Path, s: TrainSettings, progress: bool = True) -> dict:
    from tpserve.train.data import load_rows, prepare

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if not (out / "data.json").is_file():
        prepare(out, docs=s.docs, seed=s.seed, vocab_size=s.vocab_size, seq_len=s.seq_len)
    rows, info = load_rows(out)
    s = replace(s, docs=info["docs"])  # the corpus trained on, where it was prepared beforehand
    if rows.shape[1] != s.seq_len:
        raise ValueError(f"seq_len: {s.seq_len} but {out / 'data.json'} has rows of {rows.shape[1]}")
    raw = presets.config_dict(s.preset, info["vocab_size"], info["eos_token_id"], info["pad_token_id"])
    cfg = ModelConfig.from_dict(raw)
    device = _device(s)
    torch.manual_seed(s.seed)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    if s.moe not in ("auto", "loop", "dense"):
        raise ValueError(f"moe: {s.moe!r}, expected auto, loop or dense")
    model = TrainModel(cfg, mtp=s.mtp_depths > 0, device=device,
                       dense_moe=s.moe == "dense" or (s.moe == "auto" and device.type == "cuda"))
    init_weights_(model, s.seed)
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": s.weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=s.lr, betas=(0.9, 0.95), eps=1e-8)
    state = {"step": 0, "total": s.steps, "history": [], "seconds": 0.0}
    if (out / "state.pt").is_file():
        saved = torch.load(out / "state.pt", map_location=device, weights_only=False)
        if any(k.startswith("mtp.layer.") for k in saved["model"]):  # (MtpHead: the MTP layer with mHC)
            raise ValueError(f"{out / 'state.pt'}: a run of the pre-release MTP layout (mHC on the MTP layer); "
                             "train into a new directory (the data files may be copied over)")
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])
        state = saved["state"]
        if s.steps is not None:  # an explicit --steps extends (or shortens) a resumed run
            state["total"] = s.steps
    batches = Batches(rows, s.batch, s.seed)
    total = state["total"] or 10**9
    bar = tqdm(total=total if state["total"] else None, initial=state["step"], desc="train-demo",
               disable=not progress, dynamic_ncols=True)
    t_probe = None
    call_start = time.time()
    start = call_start - state["seconds"]
    while state["step"] < total:
        step = state["step"]
        if s.steps is None and time.time() - start > 1.2 * s.time_budget:
            break  # the measured step time was too optimistic: stop, export, resume later
        if s.stop_after is not None and time.time() - call_start > s.stop_after:
            break  # this call's time is up: save, export, resume later
        if state["total"] is None and step == 3:
            _sync(device)
            t_probe = time.time()
        if state["total"] is None and step == 8:
            _sync(device)
            per_step = (time.time() - t_probe) / 5
            state["total"] = total = max(9, int((s.time_budget - (time.time() - start)) / per_step) + 8)
            bar.total = total
        for g in opt.param_groups:
            g["lr"] = lr_at(s, step, total if state["total"] else 10**9)
        ids = batches(step).to(device)
        loss, parts = losses(model, ids, s)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        balance_(parts.pop("loads"), s.bias_rate)
        state["step"] = step + 1
        if step % 10 == 0 or state["step"] == total:
            record = {k: round(float(v.detach()), 4) for k, v in parts.items()}
            record.update(step=step, loss=round(float(loss.detach()), 4))
            state["history"].append(record)
            bar.set_postfix(loss=f"{record['loss']:.3f}", main=f"{record['main']:.3f}")
        bar.update(1)
        if state["step"] % s.save_every == 0:
            save_state(out, model, opt, state, s, start)
    bar.close()
    save_state(out, model, opt, state, s, start)
    result = export(model, raw, out, s, state, info)
    plot_losses(state["history"], out / "loss.png")
    return result


def save_state(out: Path, model, opt, state: dict, s: TrainSettings, start: float) -> None:
    state["seconds"] = time.time() - start
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "state": state, "settings": asdict(s)},
               out / "state.pt")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def export(model: TrainModel, raw: dict, out: Path, s: TrainSettings, state: dict, info: dict) -> dict:
    from safetensors.torch import save_file

    target = out / "model"
    target.mkdir(parents=True, exist_ok=True)
    for old in target.glob("model*.safetensors*"):
        old.unlink()
    dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}[s.save_dtype]
    tensors = {k: v.to("cpu", dtype).contiguous() for k, v in sorted(model.checkpoint_tensors().items())}
    shards, cur, size = [], {}, 0
    for name, t in tensors.items():
        nbytes = t.numel() * t.element_size()
        if cur and size + nbytes > SHARD_BYTES:
            shards.append(cur)
            cur, size = {}, 0
        cur[name] = t
        size += nbytes
    shards.append(cur)
    if len(shards) == 1:
        save_file(shards[0], str(target / "model.safetensors"), metadata={"format": "pt"})
    else:
        weight_map = {}
        for i, shard in enumerate(shards, start=1):
            fname = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
            save_file(shard, str(target / fname), metadata={"format": "pt"})
            weight_map.update({k: fname for k in shard})
        total_size = sum(t.numel() * t.element_size() for t in tensors.values())
        (target / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {"total_size": total_size}, "weight_map": weight_map}, indent=2) + "\n")
    (target / "config.json").write_text(json.dumps(raw, indent=2) + "\n")
    gen = {"eos_token_id": info["eos_token_id"], "pad_token_id": info["pad_token_id"], "do_sample": False}
    (target / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    result = {"settings": asdict(s), "steps": state["step"], "seconds": round(state["seconds"], 1),
              "tokens_seen": state["step"] * s.batch * s.seq_len,
              "final": state["history"][-1] if state["history"] else None,
              "params": sum(t.numel() for t in tensors.values()), "data": info}
    (target / "train_info.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "losses.json").write_text(json.dumps(state["history"]) + "\n")
    return result


def plot_losses(history: list[dict], path: Path) -> bool:
    """The loss curves as a PNG; False when matplotlib is missing (plot later from losses.json)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    if not history:
        return False
    fig, ax = plt.subplots(figsize=(7, 4))
    steps = [h["step"] for h in history]
    for key in [k for k in history[-1] if k not in ("step", "loss")]:
        ax.plot(steps, [h.get(key, float("nan")) for h in history], label=key)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title("train-demo: cross-entropy (main, MTP depths) and indexer KL")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
