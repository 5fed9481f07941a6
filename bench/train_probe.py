"""Training-step time of the demo preset (issue 13): which settings buy the most tokens per second.

    python bench/train_probe.py [--device cuda] [--configs dense:64:none dense:64:none:16 ...]

For each (MoE form, batch rows, torch.compile scope, KDA chunk): builds the model, runs `--warmup` optimizer
steps and times `--steps` more (synchronised wall time, median per step), on random token rows
(the step time does not depend on the tokens). Prints a table of ms/step and tokens/s, and the
top device ops of one profiled step for the first configuration.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def build(moe: str, device: torch.device, vocab: int = 4096):
    from tpserve.model.config import ModelConfig
    from tpserve.train import presets
    from tpserve.train.model import TrainModel, init_weights_

    cfg = ModelConfig.from_dict(presets.config_dict("demo", vocab, [1], 0))
    model = TrainModel(cfg, mtp=True, device=device, dense_moe=moe == "dense")
    init_weights_(model, 0)
    params = [p for p in model.parameters() if p.requires_grad]
    return model, params, torch.optim.AdamW(params, lr=1e-3)


def compile_scope(scope: str) -> None:
    """Wrap the training blocks in torch.compile (module attributes: model.py calls them through
    the module, so replacing them here is enough)."""
    from tpserve.train import attention, blocks

    if scope == "none":
        return
    for name in ("hc_collapse", "hc_expand", "rms_norm"):
        setattr(blocks, name, torch.compile(getattr(blocks, name), dynamic=False))
    if scope == "all":
        for name in ("kda", "moe", "dense_mlp"):
            setattr(blocks, name, torch.compile(getattr(blocks, name), dynamic=False))
        attention.mla = torch.compile(attention.mla, dynamic=False)


def step_fn(model, params, opt, ids):
    from tpserve.train.settings import TrainSettings
    from tpserve.train.trainer import balance_, losses

    loss, parts = losses(model, ids, TrainSettings())
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    balance_(parts.pop("loads"), 1e-3)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--configs", nargs="+", default=["loop:32:none", "dense:32:none", "dense:64:none",
                                                      "dense:128:none", "dense:64:hc", "dense:64:all"],
                   help="moe:rows:compile[:kda_chunk] entries")
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--profile", action="store_true")
    args = p.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    rows = []
    for i, entry in enumerate(args.configs):
        moe, batch, scope, *chunk = entry.split(":")
        batch = int(batch)
        from importlib import reload

        from tpserve.train import attention, blocks
        reload(blocks), reload(attention)  # undo an earlier config's compile wrapping (in place:
        # model.py reads blocks.* and attention.* through the modules at call time)
        if chunk:
            blocks.KDA_CHUNK = int(chunk[0])
        compile_scope(scope)
        try:
            model, params, opt = build(moe, device)
            ids = torch.randint(0, 4096, (batch, args.seq_len), device=device)
            t0 = time.time()
            for _ in range(args.warmup):
                step_fn(model, params, opt, ids)
            sync(device)
            warm_s = time.time() - t0
            times = []
            for _ in range(args.steps):
                t = time.time()
                step_fn(model, params, opt, ids)
                sync(device)
                times.append(time.time() - t)
            ms = 1e3 * statistics.median(times)
            mem = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else float("nan")
            rows.append((entry, ms, batch * args.seq_len / ms * 1e3, warm_s, mem))
            print(f"{entry:18s} {ms:9.1f} ms/step {rows[-1][2]:10.0f} tok/s  warm-up {warm_s:6.1f} s  "
                  f"peak {mem:6.1f} GiB", flush=True)
            if args.profile and i == 0:
                from torch.profiler import ProfilerActivity, profile

                acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
                with profile(activities=acts) as prof:
                    step_fn(model, params, opt, ids)
                    sync(device)
                key = "cuda_time_total" if device.type == "cuda" else "cpu_time_total"
                print(prof.key_averages().table(sort_by=key, row_limit=14, max_name_column_width=50))
        except torch.OutOfMemoryError as e:
            print(f"{entry:18s} out of memory: {str(e)[:120]}", flush=True)
        finally:
            model = params = opt = None
            if device.type == "cuda":
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
    print("\n| config (moe:rows:compile[:chunk]) | ms/step | tokens/s | warm-up s | peak GiB |\n| --- | ---: | ---: | ---: | ---: |")
    for entry, ms, tps, warm, mem in rows:
        print(f"| {entry} | {ms:.1f} | {tps:,.0f} | {warm:.1f} | {mem:.1f} |")


if __name__ == "__main__":
    main()
