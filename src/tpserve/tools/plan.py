"""`tpserve plan MODEL`: the memory plan per rank (weights in their quantized layout, KV cache,
KDA states, concurrent long requests) from config.json alone; nothing is loaded or allocated."""

from __future__ import annotations


def register(sub, bench, tune) -> None:
    p = sub.add_parser("plan", help="memory plan per rank, without loading weights")
    p.add_argument("model", help="checkpoint directory (config.json; its tensors decide the layout if present)")
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--quantization", default=None, help="fp8, nvfp4, none (default: the checkpoint's)")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    p.add_argument("--gpu-memory", default="139.8GiB", help="device memory (default: one H200)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.85)
    p.add_argument("--request-tokens", type=int, default=32768)
    p.add_argument("--num-layers", type=int, default=None, help="cut the config to its first N layers")
    p.add_argument("--dummy", action="store_true", help="plan the layout of --load-format dummy (no tensors read)")
    p.set_defaults(func=_main)


def _main(args) -> int:
    import torch

    from tpserve.config import parse_bytes
    from tpserve.collectives.comm import Communicator
    from tpserve.kernels.choice import Kernels, WeightOptions
    from tpserve.model.build import plan_model
    from tpserve.model.config import ModelConfig
    from tpserve.model.layers import ShardContext
    from tpserve.model.loader import checkpoint_files
    from tpserve.model.plan import ACTIVATION_RESERVE, cut_layers, memory_plan

    cfg = ModelConfig.from_file(args.model)
    if args.num_layers:
        cfg = cut_layers(cfg, args.num_layers)
        print(f"config cut to {cfg.num_hidden_layers} of its layers (--num-layers)")
    dtype = getattr(torch, args.dtype)
    dummy = args.dummy
    if not dummy:
        try:
            checkpoint_files(args.model)
        except ValueError:
            dummy = True
    kernels = Kernels(weights=WeightOptions(quantization=args.quantization))
    fits = True
    for rank in range(args.tp):
        ctx = ShardContext(rank, args.tp, dtype, Communicator(None, torch.device("cpu")))
        model, qc, _ = plan_model(args.model, cfg, ctx, kernels, "dummy" if dummy else "auto")
        mp = memory_plan(model, cfg, rank=rank, world=args.tp, dtype=dtype, device_bytes=parse_bytes(args.gpu_memory),
                         utilization=args.gpu_memory_utilization, activation_bytes=ACTIVATION_RESERVE,
                         request_tokens=args.request_tokens)
        print(f"[{qc.method}{' dummy' if dummy else ''}] {mp.describe()}")
        fits = fits and mp.requests_fit >= 1
    if not fits:
        raise ValueError("memory plan does not fit (see above)")
    return 0
