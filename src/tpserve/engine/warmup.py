"""Warm-up before ready: a step of every shape class the configured engine can meet, so that Triton compiles and
autotunes each kernel specialization (and lazy setup happens) at start, not on the first requests.

The kernel phases (engine/warmup_plan.py says what each covers) run StepPlans on the executor over a few borrowed
blocks and slots (what the cache holds does not change what compiles); then requests go through add_request / step:
  sampler      greedy, sampled, penalties, logprobs and prompt logprobs, logit bias, n > 1, a grammar
  speculative  MTP speculation at batch sizes inside and above the verify graphs
Afterwards every block and slot is free, and the generator, counters and speculator are as before: outputs of later
requests are unchanged. `start` logs each phase and the boot time; `KernelWatch` logs any kernel specialization first
met after it (a shape the warm-up missed).
"""

from __future__ import annotations

import gc
import logging
import os
import time
from dataclasses import dataclass, field

import torch

from tpserve.engine.graphs import SPEC_MAX_BATCH
from tpserve.engine.runner import StepPlan
from tpserve.engine.warmup_plan import Limits, Seq, limits, plan
from tpserve.sampling_params import SamplingParams

log = logging.getLogger("tpserve.warmup")


@dataclass
class KernelWatch:
    """Triton kernel specializations met in this process (each compiled, or loaded from the cache dir, once):
    counted until ready, then logged one by one (a shape the warm-up missed, or every one without it)."""

    met: int = 0
    ready_at: int | None = None
    installed: bool = False

    def install(self) -> bool:
        if not self.installed:
            try:
                from triton import knobs
            except ImportError:
                return False
            before = knobs.runtime.jit_cache_hook
            knobs.runtime.jit_cache_hook = lambda **kw: self._hook(before, kw)
            self.installed = True
        return True

    def _hook(self, before, kw):
        self.met += 1
        if self.ready_at is not None and self.met - self.ready_at <= 50:
            log.info("kernel specialization first met after ready: %s", describe(kw))
        return before(**kw) if before is not None else None

    @property
    def after(self) -> int | None:
        return None if self.ready_at is None else self.met - self.ready_at


WATCH = KernelWatch()


def describe(kw: dict) -> str:
    """A jit_cache_hook call as `kernel(arg=type/specialization, ...)`: what made this build differ (constexpr
    values, '/D' for a pointer aligned to 16 bytes or an integer divisible by 16)."""
    try:
        c = kw["compile"]
        consts = {path[0]: v for path, v in c["constants"].items() if len(path) == 1}
        aligned = {path[0] for path, v in c["configs"][0].items() if len(path) == 1 and "divisibility" in str(v)}
        args = ", ".join(f"{n}={consts[i]}" if i in consts else f"{n}={t}" + ("/D" if i in aligned else "")
                         for i, (n, t) in enumerate(c["signature"].items()))
        return f"{kw['fn'].name}({args})"
    except (KeyError, AttributeError, TypeError, ValueError, IndexError):
        fn = getattr(kw.get("fn"), "name", None)
        return f"{fn} {str(kw.get('key'))[:400]}" if fn else str(kw.get("repr"))[:400]


@dataclass
class Boot:
    """Start-up seconds (load: the engine built, warm-up: this module) and the warm-up's step counts."""

    load: float
    on: bool = False  # the warm-up ran (--warmup; the server then warms its routes too: server/route_warmup.py)
    warmup: float = 0.0
    steps: dict[str, int] = field(default_factory=dict)
    watched: bool = False
    frozen: int = 0  # objects moved out of the garbage collector's walks (`freeze_heap`)

    def stats(self) -> dict:
        out = {"boot_seconds": self.load + self.warmup, "boot_load_seconds": self.load,
               "boot_warmup_seconds": self.warmup}
        if self.watched and WATCH.after is not None:
            out["kernels_after_ready"] = WATCH.after
        return out


def start(engine, t0: float) -> Boot:
    """The end of LLMEngine's constructor: warm up (--warmup; by default on CUDA only, as a CPU compiles nothing),
    then the boot line."""
    boot = Boot(time.perf_counter() - t0, watched=engine.device.type == "cuda" and WATCH.install())
    WATCH.ready_at = None
    on = engine.ecfg.warmup if engine.ecfg.warmup is not None else engine.device.type == "cuda"
    boot.on = on
    if on:
        t1 = time.perf_counter()
        try:
            boot.steps = run(engine)
        except BaseException:
            engine.shutdown()  # (TP workers, graphs)
            raise
        boot.frozen = freeze_heap()
        boot.warmup = time.perf_counter() - t1
        log.info("warm-up: %d objects of the boot frozen out of the garbage collector's walks", boot.frozen)
    WATCH.ready_at = WATCH.met
    up = _process_seconds()
    log.info("ready in %.1f s (load %.1f s, warm-up %s)%s", boot.load + boot.warmup, boot.load,
             f"{boot.warmup:.1f} s" if on else "off",
             "" if up is None else f"; the process started {up:.1f} s ago")
    return boot


def freeze_heap() -> int:
    """Collect, then move every object the boot made (modules, compiled kernels, the tokenizer) to the collector's
    permanent generation, as vLLM does after start-up: a full collection while requests run would otherwise walk
    them all (bench/gc_pause.py). LLMEngine.shutdown unfreezes."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def _process_seconds() -> float | None:
    """Seconds since this process started (Linux: /proc), None elsewhere."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime (clock ticks after boot)
        with open("/proc/uptime") as f:
            return float(f.read().split()[0]) - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def run(engine) -> dict[str, int]:
    """Every phase, in order -> steps per phase. Leaves the engine as it found it (pools full)."""
    if engine.block_pool.num_free != engine.block_pool.num_blocks or engine.has_unfinished():
        raise RuntimeError("warm-up: the engine must be idle with every block free")
    lim = limits(engine)
    saved = (engine.generator.get_state(), engine.step_count, engine.num_added, engine.num_overlapped,
             engine.scheduler.num_preemptions)
    counts = {}
    lent = _Lent(engine)
    try:
        for name, steps in plan(lim).items():
            counts[name] = _phase(engine, name, lambda s=steps: _kernel_steps(engine, lent, s), _detail(steps))
    finally:
        lent.release()
    counts["sampler"] = _phase(engine, "sampler", lambda: _requests(engine, _sampler_batches(engine, lim)), "")
    if lim.spec_k:
        counts["speculative"] = _phase(engine, "speculative", lambda: _requests(engine, _spec_batches(engine, lim)),
                                       "")
    engine.generator.set_state(saved[0])
    engine.step_count, engine.num_added, engine.num_overlapped, engine.scheduler.num_preemptions = saved[1:]
    if engine.speculator is not None:  # nothing learned from warm-up steps (their times include compiling)
        engine.speculator = engine.new_speculator()
    reset = getattr(engine, "reset_prefix_cache", None)  # prefix caching: no warm-up prompt stays cached
    if reset is not None:
        reset()
    if (engine.block_pool.num_free, engine.slot_pool.num_free) != (engine.block_pool.num_blocks,
                                                                   engine.slot_pool.num_blocks):
        raise RuntimeError("warm-up: blocks or slots were not all given back")
    return counts


def _phase(engine, name: str, body, detail: str) -> int:
    met, t0 = WATCH.met, time.perf_counter()
    try:
        n = body()
    except Exception as exc:
        raise RuntimeError(f"warm-up failed in phase {name}: {type(exc).__name__}: {exc} (--no-warmup skips the "
                           "warm-up; the same step would fail on a request)") from exc
    if engine.device.type == "cuda":
        torch.cuda.synchronize(engine.device)
    kernels = f", {WATCH.met - met} kernel specializations" if WATCH.installed else ""
    log.info("warm-up %s: %d steps%s%s, %.2f s", name, n, detail, kernels, time.perf_counter() - t0)
    return n


def _detail(steps: list[list[Seq]]) -> str:
    if not steps:
        return ""
    tokens = [sum(n for _, n, _ in s) for s in steps]
    return f" ({min(tokens)}-{max(tokens)} tokens, contexts up to {max(c for s in steps for c, _, _ in s)})"


class _Lent:
    """Blocks and slots the kernel phases borrow: every sequence's table repeats the same few blocks."""

    def __init__(self, engine):
        self.engine = engine
        self.blocks = engine.block_pool.allocate(min(8, engine.block_pool.num_free))
        self.slots = engine.slot_pool.allocate(engine.slot_pool.num_free)

    def release(self) -> None:
        self.engine.block_pool.free(self.blocks)
        self.engine.slot_pool.free(self.slots)
        self.blocks, self.slots = [], []


def _kernel_steps(engine, lent: _Lent, steps: list[list[Seq]]) -> int:
    vocab, bs, e = engine.model_config.vocab_size, engine.executor.cache_shape.block_size, engine.ecfg
    # with prefix caching, each step also keeps a state inside a prefill chunk (the save path's kernels), into the
    # first checkpoint slot: free until requests come
    pc = engine.prefix_cache
    ckpt = pc.ckpts.first if pc is not None and pc.ckpts.capacity else None
    for seqs in steps:
        ids, pos, cu, ctx, slots, tables, logits, reset, verify = [], [], [0], [], [], [], [], [], 0
        for i, (c, n, decode) in enumerate(seqs):
            slot = lent.slots[i % len(lent.slots)]
            ids += [(7 * p + 3) % vocab for p in range(c, c + n)]
            pos += range(c, c + n)
            cu.append(cu[-1] + n)
            ctx.append(c)
            slots.append(slot)
            tables.append([lent.blocks[j % len(lent.blocks)] for j in range(-(-(c + n) // bs))])
            logits += range(cu[-2], cu[-1]) if decode and n > 1 else [cu[-1] - 1]
            verify += decode and n > 1
            if not decode and c == 0:
                reset.append(slot)
        sp = e.sequence_parallel and e.tensor_parallel_size > 1 and cu[-1] >= e.sp_min_tokens
        chunks = [(i, n - 1, ckpt) for i, (_, n, d) in enumerate(seqs) if not d and n > 1]
        saves = chunks[:1] if ckpt is not None else []
        engine.executor.execute(StepPlan(ids, pos, cu, ctx, slots, tables, logits, sorted(set(reset)), sp,
                                         sum(d for _, _, d in seqs), state_saves=saves))
        if verify:  # verify rows: their KDA inputs wait for a commit, as after a real verify step
            engine.executor.commit([1] * verify)
    return len(steps)


def _requests(engine, batches: list[list[tuple[list[int], SamplingParams]]]) -> int:
    """Each batch of requests added at once and run to the end -> forward steps run."""
    first = engine.step_count
    for k, batch in enumerate(batches):
        for i, (prompt, params) in enumerate(batch):
            engine.add_request(f"warmup-{k}-{i}", prompt, params, final_only=True)
        while engine.has_unfinished() or engine.inflight is not None:
            engine.step()
    return engine.step_count - first


def _prompt(engine, i: int, n: int = 8) -> list[int]:
    vocab = engine.model_config.vocab_size
    return [(11 * (i * n + j) + 5) % vocab for j in range(n)]


def _sampler_batches(engine, lim: Limits) -> list[list[tuple[list[int], SamplingParams]]]:
    """Sampler variants in one batch (greedy and sampled rows together), then (CUDA) sampled rows only."""
    greedy = dict(temperature=0.0, max_tokens=2, ignore_eos=True)
    sampled = dict(temperature=0.8, top_p=0.9, top_k=20, min_p=0.05, max_tokens=2, ignore_eos=True)
    n = 8 if lim.full else 1  # (one token: the CPU's per-sequence KDA prefill is its recurrent step)
    prompt = _prompt(engine, 0, n)
    mixed = [SamplingParams(**greedy), SamplingParams(**sampled, seed=1), SamplingParams(**sampled),
             SamplingParams(**greedy, repetition_penalty=1.1, presence_penalty=0.5, frequency_penalty=0.5),
             SamplingParams(**sampled, seed=2, logprobs=5, prompt_logprobs=2),
             SamplingParams(**greedy, logit_bias={prompt[0]: 1.0}, min_tokens=2),
             SamplingParams(**sampled, seed=3, n=2)]
    grammar = _grammar(engine)
    if grammar is not None:
        mixed.append(SamplingParams(**greedy, structured_outputs=grammar))
    alone = [SamplingParams(temperature=1.0, max_tokens=2, ignore_eos=True), SamplingParams(**sampled, seed=4)]
    batches = [mixed, alone] if lim.full else [mixed]
    return [[(_prompt(engine, i, n), p) for i, p in enumerate(batch)] for batch in batches]


def _grammar(engine):
    """A JSON-object grammar (llguidance), its tokenizer view kept for the server (`grammar_compiler`)."""
    if engine.tokenizer is None:
        return None
    try:
        from tpserve.engine.logits_process import GrammarCompiler

        compiler = GrammarCompiler(engine.tokenizer, engine.model_config.vocab_size, sorted(engine.eos_ids))
    except Exception as exc:  # (no llguidance, or a tokenizer it cannot read: structured output fails the same)
        log.info("warm-up: no grammar (%s: %s)", type(exc).__name__, exc)
        return None
    engine.grammar_compiler = compiler
    return compiler.json_object()


def _spec_batches(engine, lim: Limits) -> list[list[tuple[list[int], SamplingParams]]]:
    """Greedy batches inside and above the verify graphs, and a sampled request (rejection sampling)."""
    tokens = 2 * (lim.spec_k + 1) + 1 if lim.full else lim.spec_k + 2
    greedy = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    if not lim.full:
        return [[(_prompt(engine, 0), greedy)]]
    sizes = sorted({1, min(lim.max_seqs, SPEC_MAX_BATCH + 1), lim.max_seqs})
    out = [[(_prompt(engine, i), greedy) for i in range(n)] for n in sizes]
    out.append([(_prompt(engine, 0), SamplingParams(temperature=0.8, seed=5, max_tokens=tokens, ignore_eos=True))])
    return out
