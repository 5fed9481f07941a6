"""What a speculative step's pieces cost, replayed from their CUDA graphs: a decode step (1 row per
sequence) against verify steps of 1+k rows, the KDA commit, the MTP draft steps, and with fused drafting
(the default) the chain graph (catch-up and k-1 more depths) and the spec graph (greedy acceptance, commit,
catch-up and chain after a verify graph): a fused step is the verify graph of 1+k rows plus the spec graph.
Real-width KKKM layers + the MTP layer, bf16, random weights (`bench model`'s config), or --model DIR (a
checkpoint with its MTP layer, e.g. the demo model). Each graph is replayed on padding rows (dummy slot and
block), timed with CUDA events: median of --iters after warm-up. Break-even: a step must emit (its time /
a decode step's time) tokens per sequence to pay.

    python bench/verify_cost.py [--batch 1 8] [--k 3] [--iters 50] [--model DIR]
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


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, nargs="*", default=[1, 8])
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--size", choices=("real", "tiny"), default="real")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--model", default=None, help="a checkpoint with an MTP layer (its weights) instead of "
                    "real-width KKKM with random ones")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        spec = {"method": "mtp", "num_speculative_tokens": args.k, "adaptive": False}
        if args.model:
            llm = LLM(args.model, device=args.device, max_num_seqs=max(args.batch), kv_cache_memory="1GiB",
                      speculative_config=spec)
        else:
            (Path(tmp) / "config.json").write_text(json.dumps(real_width_config("KKKM", False, args.size, mtp=True)))
            llm = LLM(tmp, device=args.device, load_format="dummy", skip_tokenizer_init=True,
                      max_num_seqs=max(args.batch), kv_cache_memory="4GiB" if args.size == "real" else "64MiB",
                      speculative_config=spec)
        runner = llm.engine.executor.runner
        if runner.graphs is None:  # CPU: the same padded steps, eagerly
            runner.setup_graphs(max(args.batch), None, False, pad_on_cpu=True, num_speculative_tokens=args.k,
                                draft_graph=llm.engine.ecfg.draft_graph)
        graphs = runner.graphs
        rows = []
        print("| batch | step | rows per sequence | ms | vs decode step |\n| --- | --- | --- | --- | --- |")
        names = {"main": "verify", "commit": "KDA commit", "draft": "MTP draft", "chain": "MTP chain",
                 "spec": "spec (after verify)"}
        for b in args.batch:
            bucket = graphs.bucket(b)
            decode = time_replay(graphs, ("main", bucket, 1), args.iters)
            q = args.k + 1
            keys = [("main", bucket, r) for r in range(2, q + 1)] + [("commit", bucket, q)] + \
                   [("draft", bucket, 1), ("draft", bucket, q)]
            keys += [key for key in (("chain", bucket, q), ("spec", bucket, q)) if key in graphs.keys()]
            res = {"batch": b, "decode_ms": decode}
            print(f"| {b} | decode | 1 | {decode:.3f} | 1.00x |")
            for key in keys:
                ms = time_replay(graphs, key, args.iters)
                res[f"{names[key[0]]} q={key[2]}"] = ms
                print(f"| {b} | {names[key[0]]} | {key[2]} | {ms:.3f} | {ms / decode:.2f}x |")
            steps = {f"verify + commit + {args.k} drafts": res[f"verify q={q}"] + res[f"KDA commit q={q}"]
                     + args.k * res["MTP draft q=1"]}
            if f"spec (after verify) q={q}" in res:
                steps["fused: verify + spec"] = res[f"verify q={q}"] + res[f"spec (after verify) q={q}"]
            for name, step in steps.items():
                res[f"{name} ms"] = step
                print(f"| {b} | {name} (k={args.k}) | | {step:.3f} | "
                      f"{step / decode:.2f}x = break-even tokens per sequence-step |")
            res["break_even_tokens_per_step"] = min(steps.values()) / decode
            rows.append(res)
        llm.shutdown()
    if args.json:
        Path(args.json).write_text(json.dumps({"k": args.k, "size": args.size, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
