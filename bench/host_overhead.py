"""The engine's own host time per decode step, without a model: what is left between CUDA graphs.

    python bench/host_overhead.py [--k 3] [--batch 1] [--max-tokens 96] [--repeats 3] [--profile 25] [--adaptive]
        [--fused] [--fill]

On a GPU a decode step is a graph replay plus host work around it (scheduling, the step plan,
sampling or draft acceptance, detokenization and stop checks, the draft bookkeeping); on the H200
that host work was ~1.2 ms of a 5.8 ms speculative step (BENCHMARKS.md). Here the built-in demo
model's engine runs on the CPU with its executor replaced by a stand-in that returns logits and
drafts at once (no forward): every token follows one fixed sequence, and the stand-in drafter
proposes exactly that sequence, so every draft is accepted and a k-draft step emits k + 1 tokens.
What remains is the engine's host work alone. Prints ms per decode step and per emitted token for
plain decoding and for --k drafts (fixed k), median of --repeats rounds in which the settings alternate;
--adaptive adds the adaptive mode with
a GPU's verify-graph limit (it drafts nothing above batch 16: there it should cost what plain costs);
--fused adds fixed k with fused speculative steps (`--draft-graph fused`: acceptance, commit and the next
drafts on the device, one host copy per step); --profile N prints the N engine functions with the most own
time (cProfile, one more run). The stand-in has no CUDA graphs, so these times leave out writing a graph
step's inputs into their host twin (engine/graphs.py `_fill`): --fill times that alone, for a decode step of
--batch sequences with 20-block tables and a verify step of min(--batch, 16) sequences of k + 1 rows.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics

import torch

from tpserve import LLM, SamplingParams
from tpserve.engine.runner import Drafted
from tpserve.tools.bench.spec import step_times
from tpserve.tools.acceptance import mtp_prompts


def script_token(position: int) -> int:
    """The token every request has at `position` (after its prompt) in this benchmark."""
    return 100 + position % 97


class StandInExecutor:
    """Logits and drafts without a model: row r of a step's logits puts its maximum on the token that
    follows the row's position in the script; an MTP draft at position p proposes p + 2's. Rows come
    from a precomputed table (one index op per call), so the stand-in costs about what reading a
    graph's output costs on a GPU."""

    def __init__(self, real, vocab: int, chain: int = 0, graph_limit: int | None = None, fused: bool = False):
        self.real, self.vocab, self.chain, self.graph_limit, self.fused = real, vocab, chain, graph_limit, fused
        self.cache_shape = real.cache_shape
        self.world_size = 1
        self.table = torch.zeros(97, vocab)
        self.table[torch.arange(97), torch.tensor([script_token(p) for p in range(97)])] = 10.0

    def _rows(self, positions: list[int], offset: int) -> torch.Tensor:
        return self.table.index_select(0, torch.tensor([(p + offset) % 97 for p in positions]))

    def execute(self, plan, prev=None) -> torch.Tensor:  # prev: async scheduling's in-flight tokens (unused)
        return self._rows([plan.positions[i] for i in plan.logits_indices], 1)

    def commit(self, counts) -> None:
        pass

    def draft(self, plan, source_rows, from_main, depths: int = 1) -> Drafted:
        """Greedy draws read only `greedy` (tokens and probabilities); the logits rows are a placeholder
        of the right shape (this benchmark runs greedy requests only). depths > 1: a draft chain's
        draws [2, depths, n] (what a chain graph returns)."""
        positions = [plan.positions[i] for i in plan.logits_indices]
        if depths > 1:
            return Drafted(None, torch.tensor([[[float(script_token(p + 2 + d)) for p in positions]
                                                for d in range(depths)], [[1.0] * len(positions)] * depths],
                                              dtype=torch.float64))
        greedy = torch.tensor([[float(script_token(p + 2)) for p in positions], [1.0] * len(positions)],
                              dtype=torch.float64)
        return Drafted(self.table[:len(positions)], greedy)

    def chain_depths(self, plan=None) -> int:
        """As a GPU with chain graphs (`--draft-graph chain`): k depths when every sequence drafts."""
        if plan is None:
            return self.chain
        return self.chain if len(plan.logits_indices) == len(plan.slots) == plan.num_decode else 0

    def spec_step_limits(self) -> tuple[int, int]:
        """As a GPU with spec graphs (`--draft-graph fused`) when fused: batches up to 16."""
        return (16, 1 << 30) if self.fused and self.chain else (0, 0)

    def execute_spec(self, plan, while_waiting=None):
        """What ModelRunner.execute_spec returns, from the script: each verify row's next token (rows padded to
        k + 1), the drafts accepted (those equal to the row before's choice), the chain's draws from the last
        accepted row."""
        if while_waiting is not None:  # (a GPU runs it while the step runs)
            while_waiting()
        q, cu = self.chain + 1, plan.cu_seqlens
        greedy, accepted, last = [], [], []
        for i in range(len(plan.slots)):
            pos, ids = plan.positions[cu[i]:cu[i + 1]], plan.input_ids[cu[i]:cu[i + 1]]
            greedy.append([script_token(p + 1) for p in pos] + [0] * (q - len(pos)))
            a = 0
            while a < len(ids) - 1 and greedy[-1][a] == ids[a + 1]:
                a += 1
            accepted.append(a)
            last.append(pos[0] + a)
        draws = [[[float(script_token(p + 2 + d)) for p in last] for d in range(self.chain)],
                 [[1.0] * len(last) for _ in range(self.chain)]]
        return greedy, accepted, draws

    def verify_graph_batch(self):
        return self.graph_limit  # as a GPU's (SPEC_MAX_BATCH) when given: adaptive drafts nothing above it

    def check_alive(self) -> None:
        pass

    def shutdown(self) -> None:
        self.real.shutdown()


def decode_ms(llm: LLM, prompts: list[str], sp: SamplingParams) -> tuple[float, float]:
    """(ms per decode step, ms per emitted token) over one generate call, prefill steps left out."""
    with step_times(llm.engine) as steps:
        llm.generate(prompts, sp)
    decode = [s for s in steps if not s.prefill]
    seconds = sum(s.seconds for s in decode)
    return 1e3 * seconds / max(len(decode), 1), 1e3 * seconds / max(sum(s.tokens for s in decode), 1)


def use_stand_in(llm: LLM, stand_in: StandInExecutor) -> None:
    """Run the engine's steps on `stand_in`: the engine's executor, and its speculator's and drafter's."""
    eng = llm.engine
    eng.executor = stand_in
    if eng.speculator is not None:
        eng.speculator.executor = eng.speculator.drafter.executor = stand_in


def stand_in_llm(spec: dict | None, k: int, fused: bool, max_num_seqs: int = 8) -> LLM:
    """The demo model's engine with the stand-in executor (the draft chain as on a GPU; an adaptive setting
    gets a GPU's verify-graph limit, batch 16)."""
    llm = LLM(device="cpu", speculative_config=spec, max_num_seqs=max_num_seqs, kv_cache_memory="256MiB")
    use_stand_in(llm, StandInExecutor(llm.engine.executor, llm.engine.model_config.vocab_size,
                                      chain=k if spec and k > 1 else 0,
                                      graph_limit=16 if spec and spec.get("adaptive", True) else None, fused=fused))
    return llm


def padded_graphs(k: int, max_num_seqs: int):
    """(LLM, its StepGraphs) for the padded graph steps on the CPU: fill the host inputs, no capture."""
    llm = LLM(device="cpu", max_num_seqs=max_num_seqs, kv_cache_memory="256MiB", block_size=16,
              speculative_config={"method": "mtp", "num_speculative_tokens": k, "adaptive": False})
    runner = llm.engine.executor.runner
    runner.setup_graphs(max_num_seqs, None, enforce_eager=False, pad_on_cpu=True, num_speculative_tokens=k)
    return llm, runner.graphs


def fill_case(graphs, n: int, q: int):
    """(plan, padded batch) of a step of n sequences x q rows with 20-block tables."""
    from tpserve.engine.runner import StepPlan

    tables = [list(range(20 * i, 20 * i + 20)) for i in range(n)]
    pos = [p for i in range(n) for p in range(300 + i % 8, 300 + i % 8 + q)]
    plan = StepPlan(list(range(n * q)), pos, list(range(0, n * q + 1, q)), pos[::q], list(range(n)), tables,
                    list(range(n * q)), [], False, n)
    return plan, graphs.bucket(n) if q == 1 else next(x for x in graphs.spec_buckets if x >= n)


def fill_us(batch: int, k: int, calls: int = 500) -> tuple[float, float]:
    """us per StepGraphs._fill call: a decode step of `batch` sequences, a verify step of min(batch, 16)."""
    import time

    llm, graphs = padded_graphs(k, max(batch, 8))
    out = []
    for n, q in ((batch, 1), (min(batch, 16), k + 1)):
        plan, b = fill_case(graphs, n, q)
        for _ in range(50):
            graphs._fill(plan, b, q)
        t = time.perf_counter()
        for _ in range(calls):
            graphs._fill(plan, b, q)
        out.append(1e6 * (time.perf_counter() - t) / calls)
    llm.shutdown()
    return out[0], out[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--profile", type=int, default=0, metavar="N")
    ap.add_argument("--adaptive", action="store_true", help="also the adaptive mode, with a GPU's verify-graph "
                    "limit (batch 16) stood in for")
    ap.add_argument("--fused", action="store_true", help="also fixed k with fused speculative steps")
    ap.add_argument("--fill", action="store_true", help="only time a graph step's host inputs (_fill)")
    args = ap.parse_args()
    if args.fill:
        decode, verify = fill_us(args.batch, args.k)
        print(f"_fill: decode step of {args.batch} sequences {decode:.1f} us, verify step of "
              f"{min(args.batch, 16)} x {args.k + 1} rows {verify:.1f} us")
        return
    structured = mtp_prompts()
    prompts = [structured[i % len(structured)] for i in range(args.batch)]
    sp = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    print("| setting | ms per decode step | ms per emitted token |\n| --- | --- | --- |")
    fixed = {"method": "mtp", "num_speculative_tokens": args.k, "adaptive": False, "truncate_threshold": 0.0}
    adaptive = {"method": "mtp", "num_speculative_tokens": args.k}
    settings = [("plain", None, False), (f"k={args.k}", fixed, False)]
    if args.fused:
        settings.append((f"k={args.k} fused", fixed, True))
    if args.adaptive:
        settings.append((f"adaptive (k<={args.k})", adaptive, False))
    if args.adaptive and args.fused:
        settings.append((f"adaptive (k<={args.k}) fused", adaptive, True))
    engines = []
    for name, spec, fused in settings:
        llm = stand_in_llm(spec, args.k, fused, max(args.batch, 8))
        for _ in range(3):  # warm-up (the adaptive mode's first measurements and probes too)
            decode_ms(llm, prompts, sp)
        engines.append((name, llm))
    runs = {name: [] for name, _ in engines}
    for r in range(args.repeats):  # the settings alternate, each round in a rotated order (less exposed to drift)
        for name, llm in engines[r % len(engines):] + engines[:r % len(engines)]:
            runs[name].append(decode_ms(llm, prompts, sp))
    for name, llm in engines:
        step_ms = statistics.median(x[0] for x in runs[name])
        token_ms = statistics.median(x[1] for x in runs[name])
        print(f"| {name} | {step_ms:.3f} | {token_ms:.3f} |", flush=True)
        if args.profile:
            prof = cProfile.Profile()
            prof.enable()
            decode_ms(llm, prompts, sp)
            prof.disable()
            print(f"\n{name}: top {args.profile} by own time")
            pstats.Stats(prof).sort_stats("tottime").print_stats(args.profile)
    for _, llm in engines:
        llm.shutdown()

if __name__ == "__main__":
    main()
