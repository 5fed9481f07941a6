"""Small host lists onto the device without waiting for it.

`torch.tensor(values, device="cuda")` copies from pageable host memory with non_blocking=False, and PyTorch then
synchronizes the stream: the host waits for every kernel queued before it. In a step that async scheduling
overlaps (engine/overlap.py) that wait is the whole forward just launched, so the step loses its overlap. A
non-blocking copy from pageable
memory is staged by the driver before the call returns, so the host tensor may go at once, and it is ordered on
the stream like a kernel. On the CPU the tensor is returned as made.
"""

from __future__ import annotations

import torch


def to_device(values, device: torch.device | str, dtype: torch.dtype | None = None) -> torch.Tensor:
    """torch.tensor(values, dtype=dtype) on `device`, copied without a stream sync."""
    return torch.tensor(values, dtype=dtype).to(device, non_blocking=True)
