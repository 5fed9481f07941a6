"""What a speculative step's pieces cost at real width, replayed from their CUDA graphs: a decode step
(1 row per sequence) against verify steps of 1+k rows, the KDA commit and the MTP draft steps.
Real-width KKKM layers + the MTP layer, bf16, random weights (`bench model`'s config). Each graph is
replayed on padding rows (dummy slot and block), timed with CUDA events: median of --iters after
warm-up. Break-even: a verify step of 1+k rows plus its commit and k draft steps must emit
(their time / a decode step's time) tokens per step to pay.

    python bench/verify_cost.py [--batch 1 8] [--k 3] [--iters 50]
"""

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from tpserve import LLM
from tpserve.tools.bench.model import real_width_config


def time_replay(graphs, key, iters: int) -> float:
    """Median ms of one replay of graph `key` (its inputs: padding only)."""
    _, b, q = key
    graphs._fill(None, b, q)
    if key[0] == "commit":
        graphs.host_np[graphs.counts_at:graphs.counts_at + b] = 0
        graphs._copy(graphs.counts_at, graphs.counts_at + b)
    for _ in range(3):
        graphs._replay(key)
    times = []
    cuda = graphs.runner.device.type == "cuda"
    for _ in range(iters):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graphs._replay(key)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            graphs._replay(key)
            times.append(1000 * (time.perf_counter() - t0))
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, nargs="*", default=[1, 8])
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--size", choices=("real", "tiny"), default="real")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "config.json").write_text(json.dumps(real_width_config("KKKM", False, args.size, mtp=True)))
        llm = LLM(tmp, device=args.device, load_format="dummy", skip_tokenizer_init=True, max_num_seqs=max(args.batch),
                  kv_cache_memory="4GiB" if args.size == "real" else "64MiB",
                  speculative_config={"method": "mtp", "num_speculative_tokens": args.k, "adaptive": False})
        runner = llm.engine.executor.runner
        if runner.graphs is None:  # CPU: the same padded steps, eagerly
            runner.setup_graphs(max(args.batch), None, False, pad_on_cpu=True, num_speculative_tokens=args.k)
        graphs = runner.graphs
        rows = []
        print("| batch | step | rows per sequence | ms | vs decode step |\n| --- | --- | --- | --- | --- |")
        for b in args.batch:
            bucket = graphs.bucket(b)
            decode = time_replay(graphs, ("main", bucket, 1), args.iters)
            keys = [("main", bucket, q) for q in range(2, args.k + 2)] + [("commit", bucket, args.k + 1)] + \
                   [("draft", bucket, 1), ("draft", bucket, args.k + 1)]
            res = {"batch": b, "decode_ms": decode}
            print(f"| {b} | decode | 1 | {decode:.3f} | 1.00x |")
            for key in keys:
                ms = time_replay(graphs, key, args.iters)
                name = {"main": "verify", "commit": "KDA commit", "draft": "MTP draft"}[key[0]]
                res[f"{name} q={key[2]}"] = ms
                print(f"| {b} | {name} | {key[2]} | {ms:.3f} | {ms / decode:.2f}x |")
            step = res[f"verify q={args.k + 1}"] + res[f"KDA commit q={args.k + 1}"] + args.k * res["MTP draft q=1"]
            res["break_even_tokens_per_step"] = step / decode
            print(f"| {b} | verify + commit + {args.k} drafts (k={args.k}) | | {step:.3f} | "
                  f"{step / decode:.2f}x = break-even tokens per sequence-step |")
            rows.append(res)
        llm.shutdown()
    if args.json:
        Path(args.json).write_text(json.dumps({"k": args.k, "size": args.size, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
