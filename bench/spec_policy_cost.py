"""The adaptive-k policy's own host time per speculative step (engine/spec/policy.py), no model.

    python bench/spec_policy_cost.py [--steps 2000] [--max-k 3] [--batch 1]

Runs --steps synthetic steps through one SpecPolicy the way engine/spec/speculator.py drives it (begin_step,
choose_k, observe_acceptance per sequence, observe_step, observe_draft) with GLM-5.3-Flash's expert
counts, and prints the mean microseconds per step: the host cost adaptive k adds to every step,
against a fixed k that runs none of it.
"""

from __future__ import annotations

import argparse
import random
import time

from tpserve.engine.spec.policy import SpecPolicy


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--max-k", type=int, default=3)
    ap.add_argument("--batch", type=int, default=1)
    args = ap.parse_args()
    policy = SpecPolicy(args.max_k, True, 0.0, 4, num_experts=288, experts_per_token=8, num_moe_layers=42)
    rng = random.Random(0)
    seqs = [object() for _ in range(args.batch)]
    t0 = time.perf_counter()
    for _ in range(args.steps):
        choice = policy.begin_step()
        k = policy.choose_k(len(seqs), seqs)
        for s in seqs:
            policy.observe_acceptance(s, k, rng.randint(0, k), choice.explore)
        policy.observe_step(len(seqs) * (1 + k), 0.003 + 1e-4 * len(seqs) * k)
        if k:
            policy.observe_draft(k, 5e-4 + 2e-4 * k, len(seqs))
    us = 1e6 * (time.perf_counter() - t0) / args.steps
    print(f"| max_k {args.max_k}, batch {args.batch} | {us:.1f} us per step |")


if __name__ == "__main__":
    main()
