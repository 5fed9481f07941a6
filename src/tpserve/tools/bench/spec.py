"""`tpserve bench spec`: speculative decoding (MTP drafts) against plain decoding, in one run.

On the built-in demo model (or --model with MTP weights) and its structured prompts (counting, JSON, tool calls:
tools/acceptance.py; each at least once, in generate calls of --batch requests), greedy, at each --batch: plain
decoding, every fixed k of --k (adaptive off, no truncation) and the adaptive policy. Reports output tok/s and the
speedup over plain, end to end and for decoding alone (the steps without a prefill chunk: with speculation the
prefill also runs the MTP layer over every prompt position), the mean accepted length, whether the tokens equal
plain decoding's, and the KDA state bytes per request (which speculation must leave unchanged). Every setting first
runs one untimed pass of the same generate calls, so the timed passes see the adaptive policy as a long-running
server does, after it has learned its costs and acceptance (it needs ~80 steps from a cold start). The settings'
engines live side by side and their timed runs alternate (best of --repeats each), so a drift during the run does
not fall on one of them. For adaptive k it prints what the policy measured of its own steps beside its decode steps
timed from outside the engine, drafting and plain apart (`decode_modes`). Optional PNG plot.
"""

from __future__ import annotations

import contextlib
import json
import time
from typing import NamedTuple

from tpserve.tools.common import add_engine_args, engine_config_from_args


def register(sub, bench, tune) -> None:
    p = bench.add_parser("spec", help="speculative against plain decoding: tok/s, accepted length")
    add_engine_args(p, model_positional=False)
    p.add_argument("--batch", type=int, nargs="*", default=[1, 64], help="concurrent requests")
    p.add_argument("--k", type=int, nargs="*", default=[1, 2, 3, 5, 7],
                   help="fixed draft counts to compare (every setting's engine is held at once: for a model that fits "
                        "only a few times, fewer of them or --no-fixed)")
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--repeats", type=int, default=2, help="timed runs per setting (best taken)")
    p.add_argument("--no-fixed", dest="fixed", action="store_false",
                   help="leave out the fixed-k rows (only off and adaptive: e.g. at large batches, where fixed k "
                        "runs eager steps)")
    p.add_argument("--json", dest="json_out", default=None)
    p.add_argument("--plot", default=None, metavar="PNG", help="tok/s per setting and batch size")
    p.add_argument("--trace", default=None, metavar="JSONL",
                   help="adaptive k's timed steps, one JSON line each: mode, tokens, time, the k it chose next, its "
                        "rates at the running batch, prompt passes run and skipped (reading them is not timed)")
    p.set_defaults(func=run)


def _settings(ks: list[int], fixed: bool = True) -> list[tuple[str, dict | None]]:
    out: list[tuple[str, dict | None]] = [("off", None)]
    out += [(f"k={k}", {"method": "mtp", "num_speculative_tokens": k, "adaptive": False, "truncate_threshold": 0.0})
            for k in ks if fixed]
    out.append((f"adaptive (k<={max(ks)})", {"method": "mtp", "num_speculative_tokens": max(ks)}))
    return out


def _state_bytes(llm) -> int:
    cache = llm.engine.executor.runner.cache
    slots = llm.engine.slot_pool.num_blocks + 1  # the reserved dummy slot is allocated too
    total = sum(t.numel() * t.element_size() for d in (cache.kda_state, cache.conv_state) for t in d.values())
    return total // slots


class Step(NamedTuple):
    """One engine step as `step_times` saw it."""

    seconds: float
    prefill: bool  # it held a prefill chunk
    tokens: int  # tokens it emitted
    drafted: bool = False  # it verified drafts
    seqs: int = 0  # sequences it ran (a call that only lands the step in flight: that step's)
    state: dict | None = None  # adaptive k's state after it (`step_times`' probe)
    probe_seconds: float = 0.0  # the probe's own time (left out of the call's: only the traced engine runs it)


@contextlib.contextmanager
def step_times(engine, probe=None):
    """Time every engine step: yields a list that fills with a `Step` each (with `probe()` taken after it, where
    given). With async scheduling a decode step's tokens count when it is launched (as placeholders), and a call
    that only lands the step in flight counts its wait with no tokens."""
    steps: list[Step] = []
    counters = engine.speculator.counters if engine.speculator is not None else None
    schedule, step = engine.scheduler.schedule, engine.step
    prefill, seqs = [False], [0]

    def timed_schedule():
        scheduled = schedule()
        prefill[0] = any(not s.decode for s in scheduled)
        if scheduled:
            seqs[0] = len(scheduled)
        return scheduled

    def generated() -> int:  # output tokens of the requests the engine holds
        return sum(len(s.output_ids) for seqs, _ in engine.requests.values() for s in seqs)

    def timed_step():
        before = generated()
        verified = counters.num_drafts if counters is not None else 0
        prefill[0] = False  # (a call that schedules nothing: it lands the async step in flight)
        t = time.perf_counter()
        out = step()
        seconds = time.perf_counter() - t
        # finished requests leave the engine in the step that reports them (final-only requests report
        # nothing else): count them from their outputs, the rest from the engine's sequences
        gone = sum(len(c.token_ids) for o in out if o.finished for c in o.outputs)
        drafted = counters is not None and counters.num_drafts > verified
        t = time.perf_counter()
        state = probe() if probe is not None else None
        steps.append(Step(seconds, prefill[0], generated() + gone - before, drafted, seqs[0], state,
                          time.perf_counter() - t if probe is not None else 0.0))
        return out
    engine.scheduler.schedule, engine.step = timed_schedule, timed_step
    try:
        yield steps
    finally:
        del engine.scheduler.schedule, engine.step



def structured_groups(batch: int) -> list[list[str]]:
    """Every structured prompt (tools/acceptance.py) at least once, in generate calls of `batch`."""
    from tpserve.tools.acceptance import mtp_prompts

    structured = mtp_prompts()
    prompts = [structured[i % len(structured)] for i in range(max(batch, len(structured)))]
    return [prompts[i:i + batch] for i in range(0, len(prompts), batch)]


def rates_seen(llm) -> dict | None:
    """What adaptive k measured of its own steps (engine/spec/rates.py): emitted tok/s with and without drafts
    per batch bucket, the plain steps being those of this engine (its MTP layer catching up), not of one without
    speculation."""
    spec = llm.engine.speculator
    return None if spec is None or not spec.spec.adaptive else spec.rates.snapshot()


def prompt_passes_seen(llm) -> dict | None:
    """Adaptive k's prompt MTP passes: how many its pay-back rule ran and skipped, their least measured costs."""
    spec = llm.engine.speculator
    return None if spec is None or not spec.spec.adaptive else spec.pass_cost.snapshot()


def adaptive_state(engine) -> dict:
    """What adaptive k decides by after a step (the `--trace` probe): the k it chose for the next step, whether the
    speculator stepped aside, the running batch, its rates at that batch's bucket and the prompt passes so far."""
    spec, running = engine.speculator, len(engine.scheduler.running)
    bucket = spec.rates.bucket(max(running, 1))
    rates = {key: row for key, row in spec.rates.snapshot().items() if key.startswith(f"batch<={bucket} ")}
    return {"next_k": spec.last_k, "aside": spec.idle_since is not None, "running": running, "rates": rates,
            "passes_ran": spec.pass_cost.ran, "passes_skipped": spec.pass_cost.skipped}


def decode_rate(steps: list[Step]) -> float:
    """Tokens per second over the steps (from step_times) that held no prefill chunk."""
    decode = [s for s in steps if not s.prefill]
    return sum(s.tokens for s in decode) / max(sum(s.seconds for s in decode), 1e-9)


def decode_modes(steps: list[Step], batch: int) -> dict:
    """The steps without a prefill chunk that ran as many sequences as `batch` up to its power-of-two bucket
    (where adaptive k compares the modes), those that verified drafts and the others apart: steps, tokens,
    tokens per second and ms a step (what adaptive k's own measurements estimate, here timed from outside the
    engine)."""
    from tpserve.engine.spec.rates import MeasuredRates

    bucket = MeasuredRates.bucket(batch)
    out = {}
    for mode, drafted in (("spec", True), ("plain", False)):
        picked = [s for s in steps if not s.prefill and s.drafted == drafted and MeasuredRates.bucket(s.seqs) == bucket]
        tokens, seconds = sum(s.tokens for s in picked), sum(s.seconds for s in picked)
        out[mode] = {"steps": len(picked), "tokens": tokens,
                     "tok_s": round(tokens / seconds, 1) if seconds > 0 else None,
                     "ms_per_step": round(1e3 * seconds / len(picked), 3) if picked else None}
    return out


def per_request(steps: list[Step]) -> list[tuple[int, int, int]]:
    """At batch 1 (each prefill step begins the next request): per request, its decode steps that verified drafts,
    their tokens, and its plain decode steps."""
    out: list[list[int]] = []
    for s in steps:
        if s.prefill:
            out.append([0, 0, 0])
        elif out and s.tokens:  # (a call that only lands the step in flight emits nothing)
            row = out[-1]
            if s.drafted:
                row[0] += 1
                row[1] += s.tokens
            else:
                row[2] += 1
    return [tuple(r) for r in out]


def time_split(steps: list[Step], seconds: float, calls: int) -> dict:
    """Milliseconds per generate call: in steps with a prefill chunk, in the other steps, and outside
    the engine's steps (adding requests, detokenizing, returning outputs)."""
    prefill = sum(s.seconds for s in steps if s.prefill)
    decode = sum(s.seconds for s in steps if not s.prefill)
    return {"prefill": 1e3 * prefill / calls, "decode": 1e3 * decode / calls,
            "outside": 1e3 * (seconds - prefill - decode) / calls}


def _release_memory() -> None:
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def engine_options(base) -> dict:
    """LLM keyword arguments for an EngineConfig (all of its fields but the speculative config, which each
    setting gives)."""
    import dataclasses

    return {f.name: getattr(base, f.name) for f in dataclasses.fields(base) if f.name != "speculative_config"}


def measure(args) -> dict:
    import torch
    from tqdm import tqdm

    from tpserve import LLM, SamplingParams
    from tpserve.tools.acceptance import mtp_prompts

    base = engine_config_from_args(args)
    trace = getattr(args, "trace", None)
    if trace:
        open(trace, "w").close()  # (each timed run's steps are appended)
    sp = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    settings = _settings(sorted(set(args.k)), args.fixed)
    kw = engine_options(base)  # every switch given on the command line reaches the engines
    kw["max_num_seqs"] = max(max(args.batch), kw["max_num_seqs"] or 0)
    if kw["warmup"] is None:  # the untimed pass below compiles what the timed ones meet
        kw["warmup"] = False
    on_gpu = kw["device"] == "cuda" or (kw["device"] == "auto" and torch.cuda.is_available())
    if kw["kv_cache_memory"] is None and on_gpu:
        kw["kv_cache_memory"] = 2 * 2**30  # every setting's engine lives in this process at once
    rows, reference, engines = [], {}, []
    with tqdm(total=len(settings) + len(args.batch) * (1 + args.repeats), desc="bench spec") as bar:
        for name, spec in settings:
            engines.append((name, spec, LLM(**{k: v for k, v in kw.items() if v is not None}, speculative_config=spec)))
            bar.update(1)
        for batch in args.batch:
            groups = structured_groups(batch)
            runs = {}
            for name, _, llm in engines:
                # warm-up: one untimed pass of the same calls (kernels, graphs, and what the adaptive
                # policy learns: costs and acceptance; from a cold start it spends ~80 steps on it)
                for g in groups:
                    llm.generate(g, sp)
                passes0 = prompt_passes_seen(llm)
                runs[name] = {"best": None, "best_decode": None, "stats0": llm.engine.stats(), "passes0": passes0,
                              "probe": (lambda e=llm.engine: adaptive_state(e)) if trace and passes0 else None}
            bar.update(1)
            for repeat in range(args.repeats):
                # the settings' timed runs alternate, so a drift (clocks, a machine's first minutes) falls on all
                for name, spec, llm in engines:
                    run = runs[name]
                    with step_times(llm.engine, run["probe"]) as steps:
                        t0 = time.perf_counter()
                        outs = [o for g in groups for o in llm.generate(g, sp)]
                        dt = time.perf_counter() - t0 - sum(s.probe_seconds for s in steps)
                    if run["probe"] is not None:
                        with open(trace, "a") as f:
                            f.writelines(json.dumps({"setting": name, "batch": batch, "run": repeat, "step": n,
                                                     "seqs": s.seqs, "prefill": s.prefill, "drafted": s.drafted,
                                                     "tokens": s.tokens, "ms": round(1e3 * s.seconds, 3),
                                                     **s.state}) + "\n" for n, s in enumerate(steps))
                    if run["best"] is None or dt < run["best"]:
                        run.update(best=dt, split=time_split(steps, dt, len(groups)), modes=decode_modes(steps, batch),
                                   requests=per_request(steps) if batch == 1 and spec is not None else None)
                    rate = decode_rate(steps)
                    run["best_decode"] = rate if run["best_decode"] is None else max(run["best_decode"], rate)
                    run["outs"] = outs
                bar.update(1)
            for name, spec, llm in engines:
                run = runs[name]
                stats, passes, passes0 = llm.engine.stats(), prompt_passes_seen(llm), run["passes0"]
                if passes:  # the timed runs' prompts
                    passes.update(ran=passes["ran"] - passes0["ran"], skipped=passes["skipped"] - passes0["skipped"])
                tokens = [o.outputs[0].token_ids for o in run["outs"]]
                if spec is None:
                    reference[batch] = tokens
                stats0 = run["stats0"]
                drafts = stats.get("spec_decode_num_drafts", 0) - stats0.get("spec_decode_num_drafts", 0)
                acc = (stats.get("spec_decode_num_accepted_tokens", 0)
                       - stats0.get("spec_decode_num_accepted_tokens", 0))
                rows.append({"setting": name, "batch": batch, "seconds": run["best"],
                             "tok_s": sum(map(len, tokens)) / run["best"],
                             "decode_tok_s": run["best_decode"], "ms_per_call": run["split"],
                             "decode_modes": run["modes"], "per_request": run["requests"],
                             "mean_accepted_length": 1 + acc / drafts if drafts else None,
                             "equal_to_plain": tokens == reference.get(batch),
                             "outputs_equal": sum(a == b for a, b in zip(tokens, reference.get(batch, []))),
                             "outputs": len(tokens), "kda_state_bytes_per_request": _state_bytes(llm),
                             "kda_path": getattr(getattr(llm.engine.executor, "runner", None), "kda_report", None),
                             "measured_rates": rates_seen(llm), "prompt_passes": passes})
    for _, _, llm in engines:
        llm.shutdown()
    del engines
    _release_memory()
    for r in rows:
        plain = next(x for x in rows if x["batch"] == r["batch"] and x["setting"] == "off")
        r["speedup"] = r["tok_s"] / plain["tok_s"]
        r["decode_speedup"] = r["decode_tok_s"] / plain["decode_tok_s"]
    return {"device": base.device, "max_tokens": args.max_tokens, "prompts": len(mtp_prompts()), "rows": rows}


def table(result: dict) -> str:
    lines = ["| batch | setting | tok/s | speedup | decode tok/s | decode speedup | mean accepted length | "
             "ms a call: prefill / decode / outside | outputs = plain | KDA state B/request |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in result["rows"]:
        mal = "-" if r["mean_accepted_length"] is None else f"{r['mean_accepted_length']:.2f}"
        ms = " / ".join(f"{r['ms_per_call'][k]:.1f}" for k in ("prefill", "decode", "outside"))
        lines.append(f"| {r['batch']} | {r['setting']} | {r['tok_s']:.1f} | {r['speedup']:.2f}x | "
                     f"{r['decode_tok_s']:.1f} | {r['decode_speedup']:.2f}x | {mal} | {ms} | "
                     f"{r['outputs_equal']}/{r['outputs']} | {r['kda_state_bytes_per_request']:,} |")
    paths = sorted({r["kda_path"] for r in result["rows"] if r.get("kda_path")})
    from tpserve.engine.spec.rates import MeasuredRates

    seen = [f"adaptive k's own measurements at batch {r['batch']}: " + ", ".join(
        f"{mode} {v['tok_s']} tok/s ({v['steps']} steps, {v['ms_per_step']} ms a step"
        + (f"; {v['expected_tok_s']} at the last batch asked about, {v['at_batch']}, its acceptance expected)"
           if "expected_tok_s" in v else ")")
        for mode, v in r["measured_rates"].items()
        if mode.startswith(f"batch<={MeasuredRates.bucket(r['batch'])} "))
        for r in result["rows"] if r.get("measured_rates")]

    def modes(r: dict) -> str:
        return ", ".join(f"{mode} {v['tok_s']} tok/s ({v['steps']} steps, {v['ms_per_step']} ms a step)"
                         for mode, v in r["decode_modes"].items() if v["steps"])

    offs = {r["batch"]: r for r in result["rows"] if r["setting"] == "off"}
    timed = [f"its decode steps of batch <= {MeasuredRates.bucket(r['batch'])} timed from outside the engine: "
             + modes(r) + (f"; without the speculator: {modes(offs[r['batch']])}" if r["batch"] in offs else "")
             for r in result["rows"] if r.get("measured_rates")]
    passes = [f"adaptive k's prompts at batch {r['batch']} (timed runs): MTP pass run {p['ran']}, "
              f"skipped {p['skipped']} (decoded plainly); from its last {p['measured']} passes (up to "
              f"{p['rows_most']} rows), {p['pass_ms']} ms + {p['row_ms']} ms a row"
              for r in result["rows"] if (p := r.get("prompt_passes"))]
    requests = [f"{r['setting']} at batch 1, request by request (its best timed run; drafting steps / their tokens / "
                "plain steps): " + ", ".join("/".join(map(str, q)) for q in r["per_request"])
                for r in result["rows"] if r.get("per_request")]
    return "\n".join(lines + [f"KDA path: {p}" for p in paths] + seen + passes + timed + requests)


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    batches = sorted({r["batch"] for r in result["rows"]})
    fig, axes = plt.subplots(1, len(batches), figsize=(5 * len(batches), 4), squeeze=False)
    for ax, b in zip(axes[0], batches):
        rows = [r for r in result["rows"] if r["batch"] == b]
        ax.bar([r["setting"] for r in rows], [r["speedup"] for r in rows],
               color=["grey"] + ["tab:blue"] * (len(rows) - 2) + ["tab:orange"])
        ax.axhline(1.0, color="black", lw=0.8)
        ax.set_title(f"batch {b} ({result['device']})")
        ax.set_ylabel("tok/s vs plain decoding")
        ax.tick_params(axis="x", rotation=45)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def run(args) -> int:
    if any(b < 1 for b in args.batch) or any(not 1 <= k <= 7 for k in args.k) or args.max_tokens < 1:
        raise SystemExit("bench spec: --batch >= 1, --k in 1..7 and --max-tokens >= 1")
    result = measure(args)
    print(table(result))
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(result, f, indent=1)
    if args.plot:
        plot(result, args.plot)
        print(f"plot: {args.plot}")
    return 0
