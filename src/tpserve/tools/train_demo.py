"""`tpserve train-demo OUT`: train the small glm5_next demo model (see tpserve/train/trainer.py)."""

from __future__ import annotations


def register(sub, bench, tune) -> None:
    from tpserve.train.settings import TrainSettings

    d = TrainSettings()
    p = sub.add_parser("train-demo", help="train the built-in demo model")
    p.add_argument("out", help="output folder (resumes from OUT/state.pt when present)")
    p.add_argument("--preset", choices=("demo", "tiny"), default=d.preset)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--steps", type=int, default=None, help="optimizer steps (default: as many as --time-budget allows)")
    p.add_argument("--time-budget", type=float, default=d.time_budget, help="seconds, when --steps is not given")
    p.add_argument("--batch", type=int, default=d.batch)
    p.add_argument("--seq-len", type=int, default=d.seq_len)
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--warmup", type=int, default=d.warmup)
    p.add_argument("--docs", type=int, default=d.docs, help="generated corpus documents")
    p.add_argument("--vocab-size", type=int, default=d.vocab_size)
    p.add_argument("--mtp-depths", type=int, default=d.mtp_depths, help="MTP chain depths trained (0: no MTP)")
    p.add_argument("--save-every", type=int, default=d.save_every)
    p.add_argument("--device", default=d.device)
    p.add_argument("--stop-after", type=float, default=None,
                   help="seconds: end this call early, save the state and export (run again to resume)")
    p.add_argument("--moe", choices=("auto", "loop", "dense"), default=d.moe,
                   help="expert forward in training: per-expert loop, or every expert over every token "
                        "(no host sync); auto = dense on GPUs")
    p.add_argument("--prepare-only", action="store_true", help="only write the corpus, tokenizer and token rows")
    p.set_defaults(func=run)


def run(args) -> int:
    import json
    from pathlib import Path

    from tpserve.train.settings import TrainSettings
    from tpserve.train.trainer import train

    for name in ("batch", "seq_len", "docs", "vocab_size", "save_every"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')}: must be at least 1")
    if args.stop_after is not None and args.stop_after <= 0:
        raise ValueError("--stop-after: must be positive")
    if args.steps is not None and args.steps < 1:
        raise ValueError("--steps: must be at least 1")
    s = TrainSettings(preset=args.preset, seed=args.seed, steps=args.steps, time_budget=args.time_budget,
                      batch=args.batch, seq_len=args.seq_len, lr=args.lr, warmup=args.warmup, docs=args.docs,
                      vocab_size=args.vocab_size, mtp_depths=args.mtp_depths, save_every=args.save_every,
                      device=args.device, moe=args.moe, stop_after=args.stop_after)
    if args.prepare_only:
        from tpserve.train.data import prepare

        info = prepare(Path(args.out), docs=s.docs, seed=s.seed, vocab_size=s.vocab_size, seq_len=s.seq_len)
        print(json.dumps(info, indent=2))
        return 0
    result = train(args.out, s)
    print(json.dumps({k: result[k] for k in ("steps", "seconds", "tokens_seen", "params", "final")}, indent=2))
    print(f"checkpoint: {Path(args.out) / 'model'}")
    return 0
