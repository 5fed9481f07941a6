"""`tpserve train-demo` settings (no heavy imports: the CLI reads the defaults)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TrainSettings:
    preset: str = "demo"
    seed: int = 0
    steps: int | None = None
    time_budget: float = 400.0
    batch: int = 32
    seq_len: int = 1024
    lr: float = 2e-3
    min_lr_frac: float = 0.1
    warmup: int = 60
    weight_decay: float = 0.1
    mtp_depths: int = 3
    mtp_weight: float = 0.3
    indexer_weight: float = 0.1
    bias_rate: float = 1e-3
    docs: int = 120000
    vocab_size: int = 4096
    save_every: int = 200
    stop_after: float | None = None  # seconds of this call: stop, save the state and export (resume later)
    device: str = "auto"
    moe: str = "auto"  # "loop" (per expert), "dense" (every expert over every token), "auto": dense on GPUs
    save_dtype: str = "bfloat16"
