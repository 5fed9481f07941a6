"""Prefix caching's checkpoint policy without a model: the multi-turn trace of `tpserve bench serve --dataset
multiturn` (N conversations of T turns at once; an opening prompt, then the answer and a new message a turn)
replayed through the scheduler and the prefix cache on a stand-in device, for several checkpoint counts. Prints
the hit rate (cached tokens over the previous prompt plus answer) overall and per turn, with answers that come
back as they were generated and as other tokens (a re-tokenized answer: then only where the prompt ended serves).

  python bench/prefix_checkpoints.py --checkpoints 53 73 137   (the GPU trace's shape: 32 x 8, 64-token blocks)
"""

from __future__ import annotations

import argparse
import random

from tpserve.engine.cache import BlockPool, SlotPool
from tpserve.engine.prefix_cache import PrefixCache
from tpserve.engine.request import Sequence
from tpserve.engine.scheduler import Scheduler
from tpserve.sampling_params import SamplingParams


def replay(args, checkpoints: int, same_answers: bool) -> tuple[float, list[float]]:
    bs, slots = args.block_size, args.max_num_seqs
    pool, slot_pool = BlockPool(args.blocks), SlotPool(slots)
    cache = PrefixCache(pool, bs, first_ckpt_slot=slots + 1, num_ckpts=checkpoints, interval=args.interval)
    sched = Scheduler(pool, slot_pool, block_size=bs, max_num_seqs=slots,
                      max_num_batched_tokens=args.max_num_batched_tokens, prefix=cache)
    rng = random.Random(0)
    words = lambda n: [rng.randrange(1000, 100_000) for _ in range(n)]  # noqa: E731
    history = [words(args.first) for _ in range(args.conversations)]
    prev: dict[int, int] = {}
    per_turn: dict[int, list[int]] = {}

    def add(c: int, t: int) -> None:
        seq = Sequence(f"{c}-{t}", 0, list(history[c]), SamplingParams(max_tokens=args.answer), args.answer,
                       frozenset())
        seq.cache_salt = f"c{c}"
        sched.add(seq)

    for c in range(args.conversations):
        add(c, 0)
    while sched.has_work():
        scheduled = sched.schedule()
        sched.take_copies()
        sched.take_fresh_slots()
        for s in scheduled:
            seq, completes = s.seq, s.completes
            seq.num_computed += s.num_tokens
            if not completes:
                continue
            seq.output_ids.append(rng.randrange(1000, 100_000))
            if len(seq.output_ids) < seq.max_tokens:
                continue
            sched.finish(seq, "length")
            c, t = map(int, seq.request_id.split("-"))
            if t:
                row = per_turn.setdefault(t + 1, [0, 0])
                row[0] += seq.num_cached_tokens
                row[1] += min(prev[c], len(seq.prompt_ids) - 1)
            if t + 1 < args.turns:
                answer = seq.output_ids if same_answers else words(len(seq.output_ids))
                history[c] = history[c] + answer + words(args.turn)
                prev[c] = len(seq.prompt_ids) + len(seq.output_ids)
                add(c, t + 1)
    cached = sum(a for a, _ in per_turn.values())
    ideal = sum(b for _, b in per_turn.values())
    return cached / ideal, [a / b for a, b in per_turn.values()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoints", type=int, nargs="+", default=[53, 73, 137])
    ap.add_argument("--conversations", type=int, default=32)
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--first", type=int, default=1516, help="tokens of the opening prompt")
    ap.add_argument("--turn", type=int, default=1500, help="tokens of each later message")
    ap.add_argument("--answer", type=int, default=200, help="tokens of each answer")
    ap.add_argument("--block-size", type=int, default=64)
    ap.add_argument("--max-num-seqs", type=int, default=64)
    ap.add_argument("--max-num-batched-tokens", type=int, default=2048)
    ap.add_argument("--interval", type=int, default=2048, help="--prefix-state-interval")
    ap.add_argument("--blocks", type=int, default=30_000)
    args = ap.parse_args()
    print("| answers sent back | checkpoints | hit rate | turns 2.. |\n| --- | --- | --- | --- |")
    for same in (True, False):
        for n in args.checkpoints:
            rate, turns = replay(args, n, same)
            print(f"| {'as generated' if same else 're-tokenized'} | {n} | {rate:.1%} | "
                  f"{' / '.join(f'{r:.0%}' for r in turns)} |", flush=True)


if __name__ == "__main__":
    main()
