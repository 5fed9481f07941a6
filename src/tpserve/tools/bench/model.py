"""`tpserve bench model`: prefill and decode-step times of real-width GLM-5.3-Flash layers.

Builds a config with GLM-5.3-Flash's sizes and a chosen layer schedule (default "KKKM": 3 KDA
+ 1 MLA layers, MoE in every layer, as DESIGN.md's transformers baseline), random weights
(--load-format dummy), and times engine steps: a whole prompt prefilled in one step, and decode
steps at a given batch. Floors: decode bytes / the card's HBM bandwidth, prefill FLOPs / its dense bf16 peak,
from the card's spec by its name (device_peaks: --hbm-tbps / --peak-tflops for others; none on a CPU).
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from tpserve.tools.common import add_engine_args, engine_config_from_args

# (name fragment, HBM TB/s, dense bf16 TFLOP/s) from the spec sheets; the first fragment in the device name wins.
CARDS = (("H100 PCIe", 2.0, 756), ("H100 NVL", 3.9, 835), ("H100", 3.35, 989), ("H200 NVL", 4.8, 835),
         ("H200", 4.8, 989))


def device_peaks(device, hbm_tbps: float | None = None, peak_tflops: float | None = None) -> dict:
    """What the floors divide by: {"card", "hbm_bytes_per_s", "bf16_flops"}, each figure the override where given
    (arguments, else TPSERVE_BENCH_HBM_TBPS / TPSERVE_BENCH_PEAK_TFLOPS), else the card's spec by its name
    (torch.cuda.get_device_name), else None (a CPU, an unknown card: no floor)."""
    import torch

    device = torch.device(device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    spec = next(((bw, peak) for frag, bw, peak in CARDS if frag in name), (None, None))
    bw = hbm_tbps or float(os.environ.get("TPSERVE_BENCH_HBM_TBPS") or 0) or spec[0]
    peak = peak_tflops or float(os.environ.get("TPSERVE_BENCH_PEAK_TFLOPS") or 0) or spec[1]
    return {"card": name, "hbm_bytes_per_s": bw and bw * 1e12, "bf16_flops": peak and peak * 1e12}


def register(sub, bench, tune) -> None:
    p = bench.add_parser("model", help="prefill / decode timing of real-width GLM-5.3-Flash layers")
    add_engine_args(p, model_positional=False)
    p.add_argument("--layers", default="KKKM", help="layer schedule: K = KDA, M = MLA (default KKKM)")
    p.add_argument("--size", choices=("real", "tiny"), default="real",
                   help="real: GLM-5.3-Flash widths; tiny: make-tiny widths (a CPU smoke test)")
    p.add_argument("--dense-first", action="store_true", help="dense MLP in the first 3 layers (the real "
                   "model); default: MoE in every layer")
    p.add_argument("--prefill", type=int, nargs="*", default=[4096], help="prompt lengths to prefill")
    p.add_argument("--decode-steps", type=int, default=32)
    p.add_argument("--batch", type=int, nargs="*", default=[1], help="decode batch sizes")
    p.add_argument("--repeats", type=int, default=3, help="prefill repetitions (median)")
    p.add_argument("--json", dest="json_out", default=None)
    p.add_argument("--hbm-tbps", type=float, help="HBM TB/s for the decode floor (default: the card's spec)")
    p.add_argument("--peak-tflops", type=float, help="bf16 TFLOP/s for prefill MFU (default: the card's spec)")
    p.add_argument("--compare-eager", action="store_true", help="run everything twice in this call: with "
                   "--enforce-eager (no CUDA graphs), then with decode graphs; print both and the ratios")
    p.add_argument("--plot", default=None, metavar="PNG", help="decode step time against batch size, with the floor")
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="after timing, profile N decode steps at the first --batch (torch.profiler, rank 0) and "
                        "print the ops that cost the most host time and the kernel launches per step")
    p.add_argument("--profile-prefill", type=int, default=0, metavar="N",
                   help="after timing, profile one prefill step of N tokens (rank 0) and print its kernels by "
                        "device time")
    p.set_defaults(func=run)


def real_width_config(layers: str, dense_first: bool, size: str = "real", mtp: bool = False) -> dict:
    kinds = {"K": "linear_attention", "M": "indexed_attention"}
    bad = set(layers) - set(kinds)
    if bad or not layers:
        raise SystemExit(f"--layers: use K and M only, got {layers!r}")
    n = len(layers)
    mlp = (["dense"] * min(3, n) + ["sparse"] * max(n - 3, 0)) if dense_first else ["sparse"] * n
    text = {"num_hidden_layers": n, "layer_types": [kinds[c] for c in layers], "mlp_layer_types": mlp,
            "indexer_types": ["full"] * n, "pad_token_id": 154820, "eos_token_id": [154820],
            "max_position_embeddings": 131072, "num_nextn_predict_layers": int(mtp)}
    if size == "tiny":
        from tpserve.model.tiny import TINY_TEXT

        text = {**TINY_TEXT, **text, "pad_token_id": 0, "eos_token_id": [1]}
    return {"model_type": "glm5_next", "text_config": text}


def decode_floor_bytes(model, cfg, batch: int = 1, context: int = 128) -> int:
    """Bytes a decode step of `batch` sequences must move: every weight once, of the routed experts
    only the expected number of distinct ones chosen (uniform routing: E (1 - (1 - k/E)^B)), one
    embedding row per token, the KDA states read and written, the selected latent rows read."""
    total = 0
    e, k = cfg.n_routed_experts, cfg.num_experts_per_tok
    touched = e * (1 - (1 - k / e) ** batch)
    for name, p in model.named_parameters():
        nbytes = p.numel() * p.element_size()
        if ".experts." in name:
            nbytes = nbytes * touched / e
        total += nbytes
    if cfg.tie_word_embeddings is False:
        total -= model.embed_tokens.weight.numel() * model.embed_tokens.weight.element_size()  # B rows are read
    heads = cfg.linear_num_heads // model.ctx.world
    total += batch * len(cfg.kda_layers) * 2 * heads * cfg.linear_head_dim ** 2 * 4
    item = model.embed_tokens.weight.element_size()
    selected = min(context, cfg.index_topk + cfg.index_kpool)
    total += batch * len(cfg.mla_layers) * selected * cfg.kv_lora_rank * item
    return int(total)


def _timed_step(engine) -> float:
    import torch

    if engine.device.type == "cuda":
        torch.cuda.synchronize(engine.device)
    start = time.perf_counter()
    engine.step()  # sampling reads the logits back, so the step has finished on return
    return time.perf_counter() - start


def finish_prefills(engine) -> None:
    """Step until every queued sequence has its first token, so that what follows are decode steps only
    (a batch's prompts can take several steps when they exceed --max-num-batched-tokens)."""
    sched = engine.scheduler
    while sched.waiting or any(not seq.output_ids for seq in sched.running):
        engine.step()


def measure(llm, prefill: list[int], batches: list[int], steps: int, repeats: int) -> dict:
    import torch

    from tpserve.sampling_params import SamplingParams

    engine = llm.engine
    gen = torch.Generator().manual_seed(0)
    once = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    rid = iter(range(10**9))

    def prompt(n):
        return torch.randint(0, engine.model_config.vocab_size, (n,), generator=gen).tolist()

    for n in [256, *prefill]:  # compile / autotune every shape before timing
        engine.add_request(f"w{next(rid)}", prompt(n), SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
        while engine.has_unfinished():
            engine.step()
    out = {"prefill": {}, "decode": {}}
    for n in prefill:
        times = []
        for _ in range(repeats):
            engine.add_request(f"p{next(rid)}", prompt(n), once)
            times.append(_timed_step(engine))
            while engine.has_unfinished():
                engine.step()
        t = statistics.median(times)
        out["prefill"][n] = {"ms": 1000 * t, "tok_per_s": n / t, "all_ms": [1000 * x for x in times]}
    for b in batches:
        params = SamplingParams(temperature=0, max_tokens=steps + 1, ignore_eos=True)
        for _ in range(b):
            engine.add_request(f"d{next(rid)}", prompt(128), params)
        finish_prefills(engine)
        times, before, graph_ms = [], engine.stats(), None
        if engine.device.type == "cuda":
            torch.cuda.synchronize(engine.device)
        last = time.perf_counter()
        while engine.has_unfinished():
            ran = engine.step_count
            engine.step()  # (synchronous: returns after reading the step's tokens; async scheduling: after
            now = time.perf_counter()  # launching this step and reading the previous one's)
            if engine.step_count > ran:  # (a call that only lands the async step in flight runs none)
                times.append(now - last)
            last = now
            if len(times) == steps // 2 and engine.has_unfinished():  # the graph's inputs: a live step's
                graph_ms = graph_replay_ms(engine, b)
                last = time.perf_counter()
        per_step = b * steps / len(times)  # tokens per step: b, or more when drafts are accepted
        after = engine.stats()
        drafts = after.get("spec_decode_num_drafts", 0) - before.get("spec_decode_num_drafts", 0)
        accepted = after.get("spec_decode_num_accepted_tokens", 0) - before.get("spec_decode_num_accepted_tokens", 0)
        out["decode"][b] = {"ms_per_step": 1000 * statistics.median(times), "steps": len(times),
                            "all_ms": [1000 * x for x in times],
                            "tok_per_s": per_step / statistics.median(times), "tokens_per_step": per_step,
                            "mean_accepted_length": 1 + accepted / drafts if drafts else None,
                            "graph_ms": graph_ms}
    return out


def graph_replay_ms(engine, batch: int, reps: int = 20) -> float | None:
    """The plain decode graph of `batch`'s bucket replayed back to back (the step time minus this is what the GPU
    waits for the host per step); None without graphs, at TP > 1 (the graphs live in the workers) and with
    speculation. Called between two steps of a running batch: the replays repeat the step just run (its states
    advance again, so the batch's later tokens are not its greedy ones; timing only). (Replayed after the batch
    had finished instead, the graph hit an illegal address on an H200; the cause was not found.)"""
    import torch

    graphs = getattr(getattr(engine.executor, "runner", None), "graphs", None)
    if graphs is None or not graphs.capture or engine.speculator is not None or batch > graphs.buckets[-1]:
        return None
    graph = graphs.graphs[("main", graphs.bucket(batch), 1)][0]
    times = []
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(reps):
            graph.replay()
        b.record()
        torch.cuda.synchronize(engine.device)
        times.append(a.elapsed_time(b) / reps)
    return statistics.median(times)


def profile_decode(llm, batch: int, steps: int, top: int = 15) -> dict:
    """Host-side cost of decode steps: top ops by self CPU time, and device kernels launched per step."""
    from torch.profiler import ProfilerActivity, profile

    from tpserve.sampling_params import SamplingParams

    engine = llm.engine
    params = SamplingParams(temperature=0, max_tokens=steps + 2, ignore_eos=True)
    for i in range(batch):
        engine.add_request(f"prof{i}", list(range(100, 228)), params)
    finish_prefills(engine)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if engine.device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            engine.step()
    while engine.has_unfinished():
        engine.step()
    events = prof.key_averages()
    launches = sum(e.count for e in events if e.key in ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC",
                                                       "cuLaunchKernelEx"))
    rows = sorted(events, key=lambda e: -e.self_cpu_time_total)[:top]
    table = [{"op": e.key, "calls_per_step": e.count / steps,
              "self_cpu_ms_per_step": e.self_cpu_time_total / 1e3 / steps} for e in rows]
    print(f"\nprofile: {steps} decode steps at batch {batch}, {launches / steps:.0f} kernel launches per step")
    print("| op | calls per step | self CPU ms per step |\n| --- | --- | --- |")
    for r in table:
        print(f"| {r['op']} | {r['calls_per_step']:.0f} | {r['self_cpu_ms_per_step']:.3f} |")
    ktable, busy = kernel_table(events, steps, top)  # busy against the step time: what the GPU waits for the host
    return {"batch": batch, "steps": steps, "launches_per_step": launches / steps, "top": table,
            "kernels": ktable, "device_busy_us_per_step": busy}


def kernel_table(events, steps: int, top: int) -> tuple[list[dict], float]:
    """The profiler's kernels (and copies) by device time per step, the first `top` printed -> (all rows, busy us
    per step). Op-level rows such as aten::argmax carry their kernels' time again: left out."""
    device_time = lambda e: getattr(e, "self_device_time_total", 0) or 0  # noqa: E731
    kernels = sorted((e for e in events if device_time(e) > 0 and not e.key.startswith("aten::")),
                     key=lambda e: -device_time(e))
    ktable = [{"kernel": e.key, "calls_per_step": e.count / steps, "device_us_per_step": device_time(e) / steps}
              for e in kernels]
    busy = sum(r["device_us_per_step"] for r in ktable)
    if ktable:
        print(f"device busy per step: {busy:.1f} us in {sum(r['calls_per_step'] for r in ktable):.0f} kernels "
              f"(all of them in the JSON)")
        print("| kernel | calls per step | device us per step |\n| --- | --- | --- |")
        for r in ktable[:top]:
            print(f"| {r['kernel'][:80]} | {r['calls_per_step']:.0f} | {r['device_us_per_step']:.1f} |")
    return ktable, busy


def profile_prefill(llm, n: int, top: int = 25) -> dict:
    """Device time of one whole-prompt prefill step of n tokens, by kernel (torch.profiler)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from tpserve.sampling_params import SamplingParams

    engine = llm.engine
    prompt = torch.randint(0, engine.model_config.vocab_size, (n,), generator=torch.Generator().manual_seed(1))
    engine.add_request("prof-prefill", prompt.tolist(), SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if engine.device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        engine.step()
    while engine.has_unfinished():
        engine.step()
    print(f"\nprofile: one prefill step of {n} tokens")
    ktable, busy = kernel_table(prof.key_averages(), 1, top)
    return {"tokens": n, "kernels": ktable, "device_busy_us": busy}


def bench_once(cfg_dict: dict, options: dict, args, enforce_eager: bool) -> dict:
    from tpserve import LLM
    from tpserve.model.config import ModelConfig

    with tempfile.TemporaryDirectory(prefix="tpserve-bench-") as tmp:
        (Path(tmp) / "config.json").write_text(json.dumps(cfg_dict))
        start = time.perf_counter()
        llm = LLM(tmp, **{**options, "enforce_eager": enforce_eager})
        boot = time.perf_counter() - start
        try:
            cfg = ModelConfig.from_dict(cfg_dict)
            runner = getattr(llm.engine.executor, "runner", None) or llm.engine.executor.state.runner
            graphs = runner.graphs
            res = measure(llm, args.prefill, args.batch, args.decode_steps, args.repeats)
            res.update(kda=runner.kda_report, kernels=runner.kernels.describe(), boot_s=boot,
                       graphs=None if graphs is None or not graphs.capture else
                       {"buckets": graphs.buckets, "capture_s": graphs.capture_seconds,
                        "memory_mib": graphs.graph_bytes / 2**20})
            res["peaks"] = peaks = device_peaks(llm.engine.device, args.hbm_tbps, args.peak_tflops)
            add_floors(res, runner.model, cfg, peaks)
            if args.profile:
                res["profile"] = profile_decode(llm, args.batch[0], args.profile)
            if args.profile_prefill:
                res["profile_prefill"] = profile_prefill(llm, args.profile_prefill)
        finally:
            llm.shutdown()
    return res


def add_floors(res: dict, model, cfg, peaks: dict) -> None:
    """Each decode row's floor_ms / of_floor and each prefill row's mfu against `peaks` (None without a figure)."""
    bw, flops = peaks["hbm_bytes_per_s"], peaks["bf16_flops"]
    for b, r in res["decode"].items():
        floor = bw and decode_floor_bytes(model, cfg, b) / bw
        r.update(floor_ms=floor and 1000 * floor, of_floor=floor and floor / (r["ms_per_step"] / 1000))
    for n, r in res["prefill"].items():
        r["mfu"] = flops and prefill_flops(model, cfg, n) / (r["ms"] / 1000) / flops


def prefill_flops(model, cfg, n: int) -> float:
    """2 x active parameters x tokens (routed experts: k of E), plus causal attention over the
    selected rows (at most index_topk + kpool per query) in the latent space, per MLA layer."""
    active = 0
    for name, p in model.named_parameters():
        if name.endswith("embed_tokens.weight"):
            continue
        active += p.numel() * (cfg.num_experts_per_tok / cfg.n_routed_experts if ".experts." in name else 1)
    heads = cfg.num_attention_heads // model.ctx.world
    width = min(cfg.index_topk + cfg.index_kpool, n)
    attn = len(cfg.mla_layers) * heads * 2 * 2 * cfg.kv_lora_rank * width * n
    return 2 * active * n + attn


def print_table(res: dict, title: str) -> None:
    bw, flops = (res["peaks"][k] and f"{res['peaks'][k] / 1e12:g}" for k in ("hbm_bytes_per_s", "bf16_flops"))
    print(f"\n{title}  (KDA: {res['kda']}; graphs: {res['graphs']}; floors for {res['peaks']['card']}: "
          f"{bw or 'no'} TB/s, {flops or 'no'} bf16 TFLOP/s)")
    print("| what | time | rate | floor | of floor |\n| --- | --- | --- | --- | --- |")
    for n, r in res["prefill"].items():
        mfu = "no floor" if r["mfu"] is None else f"{100 * r['mfu']:.1f}% MFU"
        print(f"| prefill {n} tokens | {r['ms']:.1f} ms | {r['tok_per_s']:.0f} tok/s | FLOPs | {mfu} |")
    for b, r in res["decode"].items():
        spec = "" if r.get("mean_accepted_length") is None else \
            f" (speculative: mean accepted length {r['mean_accepted_length']:.2f}, {r['tokens_per_step']:.2f} tok/step)"
        graph = "" if r.get("graph_ms") is None else f" (graph replay alone {r['graph_ms']:.3f} ms)"
        floor = "no floor | -" if r["floor_ms"] is None else f"{r['floor_ms']:.3f} ms | {100 * r['of_floor']:.1f}%"
        print(f"| decode step, batch {b}{spec}{graph} | {r['ms_per_step']:.3f} ms | {r['tok_per_s']:.1f} tok/s | "
              f"{floor} |")


def plot(results: dict[str, dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for label, res in results.items():
        bs = sorted(res["decode"], key=int)
        ax.plot(bs, [res["decode"][b]["ms_per_step"] for b in bs], "o-", label=label)
    any_res = next(iter(results.values()))
    bs, bw = sorted(any_res["decode"], key=int), any_res["peaks"]["hbm_bytes_per_s"]
    if bw:
        ax.plot(bs, [any_res["decode"][b]["floor_ms"] for b in bs], "k--", label=f"bytes floor ({bw / 1e12:g} TB/s)")
    ax.set_xlabel("decode batch (sequences)")
    ax.set_ylabel("ms per step")
    ax.set_yscale("log")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def run(args) -> int:
    import dataclasses

    ecfg = engine_config_from_args(args)
    cfg_dict = real_width_config(args.layers, args.dense_first, args.size, mtp=ecfg.speculative is not None)
    options = {f.name: getattr(ecfg, f.name) for f in dataclasses.fields(ecfg)}
    options.update(load_format="dummy", skip_tokenizer_init=True,
                   max_num_batched_tokens=max([ecfg.max_num_batched_tokens, *args.prefill, args.profile_prefill]),
                   max_num_seqs=max([ecfg.max_num_seqs, *args.batch]))
    options.pop("model")
    if options["warmup"] is None:  # the timed shapes compile in the untimed steps before each measurement
        options["warmup"] = False
    if options["kv_cache_memory"] is None:
        options["kv_cache_memory"] = 8 * 2**30 if args.size == "real" else 64 * 2**20
    modes = [("eager", True), ("graphs", False)] if args.compare_eager else [
        ("eager" if ecfg.enforce_eager else "default", ecfg.enforce_eager)]
    results = {label: bench_once(cfg_dict, options, args, eager) for label, eager in modes}
    tp = ecfg.tensor_parallel_size
    first = next(iter(results.values()))
    print(f"\nlayers {args.layers} (MoE {'after 3 dense' if args.dense_first else 'in every layer'}), TP={tp}, "
          f"{first['kernels']}, sp={ecfg.sequence_parallel}, custom_allreduce={ecfg.custom_allreduce}")
    for label, res in results.items():
        print_table(res, label)
    if args.compare_eager:
        e, g = results["eager"], results["graphs"]
        print("\n| decode batch | eager ms | graphs ms | graphs / eager |\n| --- | --- | --- | --- |")
        for b in e["decode"]:
            a, c = e["decode"][b]["ms_per_step"], g["decode"][b]["ms_per_step"]
            print(f"| {b} | {a:.3f} | {c:.3f} | {c / a:.3f} |")
    if args.plot:
        plot(results, args.plot)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"layers": args.layers, "tp": tp, "runs": results}, indent=2))
    return 0
