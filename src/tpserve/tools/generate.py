"""`tpserve generate`: offline generation from the command line (the LLM API)."""

from __future__ import annotations

from tpserve.tools.common import add_engine_args, engine_config_from_args


def register(sub, bench, tune) -> None:
    p = sub.add_parser("generate", help="generate text offline for prompts")
    add_engine_args(p)
    p.add_argument("--prompt", action="append", required=True, help="prompt text (repeatable)")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--sample-seed", type=int, default=None)
    p.set_defaults(func=run)


def run(args) -> int:
    import dataclasses

    from tpserve import LLM, SamplingParams

    cfg = engine_config_from_args(args)
    options = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
    model = options.pop("model")
    llm = LLM(model, **options)
    try:
        params = SamplingParams(temperature=args.temperature, top_p=args.top_p, max_tokens=args.max_tokens,
                                seed=args.sample_seed)
        for out in llm.generate(args.prompt, params):
            c = out.outputs[0]
            print(f"--- {out.prompt!r} -> {len(c.token_ids)} tokens ({c.finish_reason})\n{c.text}")
    finally:
        llm.shutdown()
    return 0
