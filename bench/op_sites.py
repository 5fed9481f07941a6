"""Which source lines launch the torch ops of one decode step (a TorchDispatchMode over the executor's forward).

    python bench/op_sites.py [--device cuda] [--dtype bfloat16] [--batch 1] [--top 40] [--set KEY=VALUE ...]

Runs the built-in demo model eagerly (CUDA graphs off, so every op passes through the dispatcher), prefills
--batch structured prompts, then records each op of one decode step's forward with the innermost line
of tpserve's model / kernels code that called it. Views and metadata ops (which launch no kernel) are
left out, and so are allocations (empty, zeros without a fill are counted: they launch a memset). On a
GPU each op is about one kernel launch: the table says where a graph-replayed step's ~1.7 us kernels come
from, which `bench/decode_profile.py` (kernel names only) cannot. Triton kernels do not pass through the
dispatcher: they are not counted here.
"""

from __future__ import annotations

import argparse
import traceback
from collections import Counter, defaultdict

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tpserve import LLM, SamplingParams
from tpserve.tools.acceptance import mtp_prompts

NO_KERNEL = {"view", "_unsafe_view", "as_strided", "slice", "select", "unsqueeze", "squeeze", "expand", "t",
             "transpose", "permute", "detach", "alias", "reshape", "unbind", "split", "split_with_sizes", "narrow",
             "_reshape_alias", "lift_fresh", "unfold", "diagonal", "view_as_real", "chunk", "empty", "empty_like",
             "empty_strided", "new_empty", "new_empty_strided", "resolve_conj", "resolve_neg", "_to_copy_noop",
             "is_same_size", "sym_size", "sym_stride", "sym_numel", "sym_storage_offset",
             "promote_types", "result_type", "can_cast"}  # dtype queries: no kernel either


class OpSites(TorchDispatchMode):
    """Counts ops by (site, op name); a site is the innermost frame under tpserve/model or tpserve/kernels."""

    def __init__(self):
        super().__init__()
        self.on = False
        self.counts: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.__name__.split(".")[0]
        if self.on and name not in NO_KERNEL and not (name in ("to", "_to_copy") and out is args[0]):
            frames = [f for f in traceback.extract_stack()
                      if "/tpserve/model/" in f.filename or "/tpserve/kernels/" in f.filename]
            f = frames[-1] if frames else None
            site = f"{f.filename.split('/tpserve/')[-1]}:{f.lineno} {f.name}" if f else "(engine)"
            self.counts[(site, name)] += 1
        return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--phase", default="execute", choices=("execute", "draft", "commit"),
                    help="which executor call to count: the step's forward, the MTP drafts (k=3) or the KDA commit")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="an engine option (e.g. moe_route_backend=torch); repeatable")
    args = ap.parse_args()
    kw = dict(kv.split("=", 1) for kv in args.set)
    if args.dtype:
        kw["dtype"] = args.dtype
    if args.phase != "execute":
        kw["speculative_config"] = {"method": "mtp", "num_speculative_tokens": 3, "adaptive": False}
    llm = LLM(device=args.device, enforce_eager=True, kv_cache_memory=2 * 2**30, max_num_seqs=max(8, args.batch), **kw)
    eng = llm.engine
    prompts = [mtp_prompts()[i % len(mtp_prompts())] for i in range(args.batch)]
    for i, p in enumerate(prompts):
        eng.add_request(f"s{i}", llm._tokens(p)[0], SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))
    while any(not s.in_decode for s in eng.scheduler.running) or eng.scheduler.waiting:
        eng.step()
    eng.step()  # one decode step before the counted one
    mode = OpSites()
    execute = getattr(eng.executor, args.phase)

    def counted(*a, **k):
        mode.on = True
        try:
            return execute(*a, **k)
        finally:
            mode.on = False
    setattr(eng.executor, args.phase, counted)
    with mode:
        eng.step()
    delattr(eng.executor, args.phase)
    llm.shutdown()
    by_site: dict[str, Counter] = defaultdict(Counter)
    for (site, name), n in mode.counts.items():
        by_site[site][name] += n
    total = sum(mode.counts.values())
    print(f"ops in one decode step's {args.phase} calls at batch {args.batch} ({args.device}, eager): {total}\n"
          "| ops | site | ops there |\n| --- | --- | --- |")
    for site, ops in sorted(by_site.items(), key=lambda kv: -sum(kv[1].values()))[:args.top]:
        print(f"| {sum(ops.values())} | {site} | {', '.join(f'{k} {v}' for k, v in ops.most_common(6))} |")


if __name__ == "__main__":
    main()
