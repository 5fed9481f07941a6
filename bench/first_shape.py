"""The first prefill of a new prompt length against the next one of the same length, the demo model on one GPU without
the warm-up: wall time of each, the Triton kernels met (compiled or loaded) during it, and the torch profiler's top
host-side ops of the first and the second (what a first meeting costs beyond Triton's builds).

    TRITON_PRINT_AUTOTUNING=1 python bench/first_shape.py [--model DIR] [--lengths 290 350 407] [--spec]
"""

from __future__ import annotations

import argparse
import time

import torch

from tpserve import LLM, SamplingParams
from tpserve.engine.warmup import WATCH


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="src/tpserve/builtin/glm5-next-demo")
    p.add_argument("--lengths", type=int, nargs="+", default=[290, 350, 407])
    p.add_argument("--device", default="cuda")
    p.add_argument("--spec", action="store_true", help="with MTP speculation (k = 7): the prompt's MTP pass too")
    args = p.parse_args()
    spec = {"method": "mtp", "num_speculative_tokens": 7, "adaptive": False} if args.spec else None
    llm = LLM(args.model, device=args.device, warmup=False, enable_prefix_caching=False, speculative_config=spec)
    WATCH.install()
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    sp = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    vocab = llm.engine.model_config.vocab_size
    llm.generate([{"prompt_token_ids": [5 + i % 200 for i in range(32)]}], sp)  # (lazy set-up, first steps)
    for n in args.lengths:
        for rep in range(2):
            ids = [(13 * i + 7 * rep + n) % (vocab - 10) + 5 for i in range(n)]
            met = WATCH.met
            sync()
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                t = time.perf_counter()
                llm.generate([{"prompt_token_ids": ids}], sp)
                sync()
                ms = 1e3 * (time.perf_counter() - t)
            print(f"length {n} {'first' if rep == 0 else 'second'}: {ms:.1f} ms, Triton kernels met {WATCH.met - met}")
            table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12, max_name_column_width=60)
            print("\n".join(table.splitlines()[:16]))
    llm.shutdown()


if __name__ == "__main__":
    main()
