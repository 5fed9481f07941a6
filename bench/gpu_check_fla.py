"""fla-core KDA kernels vs the torch references on this GPU, for several head sizes (prints a table)."""

import sys

import torch

from tpserve.kernels.attention.kda import select_fla_options

print("| head_dim | gate | recurrent kernel used | chosen chunk_kda options | report |\n| --- | --- | --- | --- | --- |")
for head_dim in (16, 64, 128):
    for lb in (-5.0, None):
        try:
            recurrent, opts, report = select_fla_options(head_dim, lb, torch.device("cuda"))
        except Exception as exc:  # noqa: BLE001
            recurrent, opts, report = "ERROR", "ERROR", f"{type(exc).__name__}: {exc}"[:200]
        print(f"| {head_dim} | {'lower bound -5' if lb else 'softplus'} | {recurrent} | {opts} | {report} |",
              flush=True)
sys.exit(0)
