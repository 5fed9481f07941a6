"""CUDA correctness on the tiny checkpoints (one device call; prints a table).

Every case generates greedy tokens for the same prompts (lengths 9, 120, 40, 77; chunked prefill
of 64 tokens, so prefills and decodes mix) and the prefill logits of the 120-token prompt, and is
compared with (a) the CPU float32 path and (b) CUDA TP=1:
- cuda TP=1 float32 (`--kda-backend auto`: the exact torch KDA path in float32);
- with --tp: TP=2 over NCCL without and with sequence parallelism (SP from 16 tokens, so the
  prefill chunks take the SP path and decodes plain TP);
- with --fla: fla-core's KDA kernels in float32 (TF32 rounding) and bf16 (tolerance rows).
--prefix: prefix caching on against off in float32 (a second turn through the first answer, a shared system
prompt resumed mid-prompt): tokens equal, the cached token counts, the largest logprob difference.
Usage: python bench/gpu_check_tiny.py [--tp] [--custom-allreduce] [--fla] [--kernels-only] [--norms] [--graphs]
       [--prefix]
       [--configs default,...] [--switch norm_backend|moe_route_backend|...] [--fp32-only]
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from helpers import TINY_CONFIGS, make_checkpoint, prefill_logits, random_prompts  # noqa: E402

from tpserve import LLM, SamplingParams  # noqa: E402

PARAMS = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
COMMON = dict(kv_cache_memory="64MiB", block_size=16, max_num_batched_tokens=64)


def run(llm_kwargs: dict, path: str, prompts):
    llm = LLM(path, **COMMON, **llm_kwargs)
    try:
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], PARAMS)
        return [o.outputs[0].token_ids for o in outs], prefill_logits(llm, prompts[1])
    finally:
        llm.shutdown()


def cases(args) -> list[tuple[str, dict]]:
    dev = args.device
    comm = "NCCL" if dev == "cuda" else "gloo"
    out = [(f"{dev} TP=1 fp32", dict(device=dev, dtype="float32"))]
    if args.tp:
        tp2 = dict(device=dev, dtype="float32", tensor_parallel_size=2, custom_allreduce=args.custom_allreduce)
        out.append((f"{dev} TP=2 fp32 {comm}", {**tp2, "sequence_parallel": False}))
        out.append((f"{dev} TP=2 fp32 {comm}+SP", {**tp2, "sequence_parallel": True, "sp_min_tokens": 16}))
    if args.fla:
        out.append((f"{dev} TP=1 fp32 kda=fla (TF32)", dict(device=dev, dtype="float32", kda_backend="fla")))
        out.append((f"{dev} TP=1 bf16 kda=auto", dict(device=dev, dtype="bfloat16")))
    return out


def main() -> int:
    logging.basicConfig(level=os.environ.get("TPSERVE_LOG_LEVEL", "WARNING"))
    ap = argparse.ArgumentParser()
    ap.add_argument("--tp", action="store_true", help="also check TP=2 over NCCL, with and without SP")
    ap.add_argument("--custom-allreduce", action="store_true", help="TP=2 cases use the custom collectives")
    ap.add_argument("--fla", action="store_true", help="also the fla-core KDA rows (fp32 TF32, bf16)")
    ap.add_argument("--device", default="cuda", help="cpu runs the same cases as a smoke test (gloo)")
    ap.add_argument("--kernels-only", action="store_true", help="only the bf16 agreement of the Triton mHC + MoE "
                    "kernels with the torch forms (KDA on the torch path, so nothing else differs)")
    ap.add_argument("--switch", default="norm_backend", help="with --norms: the triton|torch switch compared")
    ap.add_argument("--fp32-only", action="store_true", help="with --norms: the float32 row only")
    ap.add_argument("--configs", default=",".join(TINY_CONFIGS), help="comma list of tiny configs")
    ap.add_argument("--norms", action="store_true", help="only: greedy tokens and prefill logits with the fused "
                    "norm kernels (--norm-backend triton) vs the torch forms, fp32 and bf16, graphs on")
    ap.add_argument("--graphs", action="store_true", help="only: greedy tokens with decode CUDA graphs vs "
                    "--enforce-eager (fp32 and bf16; 5 prompts, max_num_seqs 6, so batches are padded)")
    ap.add_argument("--prefix", action="store_true", help="only: greedy tokens with prefix caching on vs off "
                    "(float32, graphs on), and the tokens each turn found cached")
    ap.add_argument("--kda", default="auto,fla", help="with --prefix: the KDA backends compared (fla: cuda only)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        paths = {name: str(make_checkpoint(Path(tmp), name)) for name in args.configs.split(",")}
        prompts = random_prompts((9, 120, 40, 77), seed=3)
        if args.prefix:
            prefix_rows(args, paths)
        elif args.graphs:
            graph_rows(args, paths, random_prompts((9, 120, 40, 77, 33), seed=3))
        elif args.norms:
            switch_rows(args, paths, prompts)
        elif args.kernels_only:
            kernel_rows(args, paths, prompts)
        else:
            main_rows(args, paths, prompts)
    return 0


def main_rows(args, paths: dict[str, str], prompts) -> None:
    head = ("| config | case | greedy equal to CPU | greedy equal to TP=1 | max logit diff vs CPU "
            "| vs TP=1 |\n| --- | --- | --- | --- | --- | --- |")
    rows: list[str] = []
    print(head, flush=True)
    for name, path in paths.items():
        cpu_tokens, cpu_logits = run({"device": "cpu", "dtype": "float32"}, path, prompts)
        tp1 = None
        for label, kwargs in cases(args):
            try:
                got, logits = run(kwargs, path, prompts)
                tp1 = tp1 or (got, logits)
                n = len(prompts)
                same_cpu = sum(a == b for a, b in zip(got, cpu_tokens))
                same_tp1 = sum(a == b for a, b in zip(got, tp1[0]))
                d_cpu = (logits.float() - cpu_logits).abs().max().item()
                d_tp1 = (logits.float() - tp1[1].float()).abs().max().item()
                row = f"| {name} | {label} | {same_cpu}/{n} | {same_tp1}/{n} | {d_cpu:.2e} | {d_tp1:.2e} |"
            except Exception as exc:  # keep going: one broken path must not hide the others
                traceback.print_exc()
                row = f"| {name} | {label} | ERROR | | {type(exc).__name__}: {str(exc)[:80]} | |"
            rows.append(row)
            print(row, flush=True)
    print("\n" + head + "\n" + "\n".join(rows))


def graph_rows(args, paths: dict[str, str], prompts) -> None:
    print("| config | dtype | graphs: greedy equal to eager | max logit diff (prefill, eager path) | captured "
          "|\n| --- | --- | --- | --- | --- |", flush=True)
    for name, path in paths.items():
        for dtype in ("float32", "bfloat16"):
            base = dict(device=args.device, dtype=dtype, max_num_seqs=6)
            eager, e_logits = run({**base, "enforce_eager": True}, path, prompts)
            llm = LLM(path, **COMMON, **base)
            try:
                graphs = llm.engine.executor.runner.graphs
                outs = llm.generate([{"prompt_token_ids": p} for p in prompts], PARAMS)
                got = [o.outputs[0].token_ids for o in outs]
                logits = prefill_logits(llm, prompts[1])
                captured = "none" if graphs is None else f"{len(graphs.graphs)} in {graphs.capture_seconds:.1f} s"
            finally:
                llm.shutdown()
            same = sum(a == b for a, b in zip(got, eager))
            diff = (logits.float() - e_logits.float()).abs().max().item()
            print(f"| {name} | {dtype} | {same}/{len(prompts)} | {diff:.2e} | {captured} |", flush=True)


def prefix_rows(args, paths: dict[str, str]) -> None:
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, logprobs=2)
    system, user1, user2, user3, more = random_prompts((70, 21, 9, 13, 15), seed=31)
    print("| config | prefix caching on: greedy equal to off | cached tokens a request | max logprob diff "
          "|\n| --- | --- | --- | --- |", flush=True)
    for name, path in paths.items():
        for kda in (k for k in args.kda.split(",") if args.device == "cuda" or k != "fla"):
            prefix_row(name, path, args.device, kda, params, (system, user1, user2, user3, more))


def prefix_row(name: str, path: str, device: str, kda: str, params, parts) -> None:
    system, user1, user2, user3, more = parts
    outs = {}
    for on in (True, False):
        llm = LLM(path, **COMMON, device=device, dtype="float32", enable_prefix_caching=on, kda_backend=kda)
        try:
            first = llm.generate([{"prompt_token_ids": system + user1}], params)[0]
            turn2 = system + user1 + first.outputs[0].token_ids + more
            rest = [llm.generate([{"prompt_token_ids": p}], params)[0]
                    for p in (turn2, system + user2, system + user3)]
            outs[on] = [first, *rest]
        finally:
            llm.shutdown()
    same = sum(a.outputs[0].token_ids == b.outputs[0].token_ids for a, b in zip(outs[True], outs[False]))
    diff = max(abs(x[t].logprob - y[t].logprob) for a, b in zip(outs[True], outs[False])
               for x, y in zip(a.outputs[0].logprobs, b.outputs[0].logprobs) for t in x.keys() & y.keys())
    cached = " / ".join(str(o.num_cached_tokens) for o in outs[True])
    print(f"| {name} kda={kda} | {same}/{len(outs[True])} | {cached} | {diff:.2e} |", flush=True)


def kernel_rows(args, paths: dict[str, str], prompts) -> None:
    print("| config | bf16 TP=1, KDA torch: Triton mHC + MoE vs torch forms | greedy equal | max logit diff "
          "| max abs logit |\n| --- | --- | --- | --- | --- |", flush=True)
    for name, path in paths.items():
        base = {"device": args.device, "dtype": "bfloat16", "kda_backend": "torch"}
        ref_tokens, ref_logits = run({**base, "mhc_backend": "torch", "moe_backend": "torch"}, path, prompts)
        got, logits = run({**base, "mhc_backend": "triton", "moe_backend": "triton"}, path, prompts)
        same = sum(a == b for a, b in zip(got, ref_tokens))
        diff = (logits.float() - ref_logits.float()).abs().max().item()
        print(f"| {name} | {args.device} | {same}/{len(prompts)} | {diff:.2e} | "
              f"{ref_logits.float().abs().max().item():.2e} |", flush=True)


def switch_rows(args, paths: dict[str, str], prompts) -> None:
    """A backend switch (--switch, default the fused norms) on triton against torch: float32 must give the
    same tokens; in bf16 the random tiny models are chaotic (bf16 vs fp32 with the torch forms moves them
    by ~3-20 logits), so there each backend is compared with the float32 run: triton must be no further.
    --fp32-only: the float32 row only."""
    sw = args.switch
    print("| config | case | greedy equal to fp32 torch | max logit diff vs fp32 torch | max abs logit |\n"
          "| --- | --- | --- | --- | --- |", flush=True)
    for name, path in paths.items():
        ref_tokens, ref_logits = run({"device": args.device, "dtype": "float32", sw: "torch"}, path, prompts)
        rows = (("float32", "triton"),) if args.fp32_only else (("float32", "triton"), ("bfloat16", "torch"),
                                                                 ("bfloat16", "triton"))
        for dtype, backend in rows:
            got, logits = run({"device": args.device, "dtype": dtype, sw: backend}, path, prompts)
            same = sum(a == b for a, b in zip(got, ref_tokens))
            diff = (logits.float() - ref_logits.float()).abs().max().item()
            print(f"| {name} | {dtype} {sw} {backend} | {same}/{len(prompts)} | {diff:.2e} | "
                  f"{ref_logits.float().abs().max().item():.2e} |", flush=True)


if __name__ == "__main__":
    sys.exit(main())
