"""The DSA indexer's decode top-k in torch (indexer_triton.top_pools' reference). The indexer's other steps keep
their torch forms in model/indexer.py."""

from __future__ import annotations

import torch


def top_pools(scores: torch.Tensor, positions: torch.Tensor, k: int, kpool: int) -> torch.Tensor:
    """The k best pools of each row of scores [n, P] (pools a row cannot see score float32's lowest) -> [n, k]."""
    return scores.topk(k, dim=-1).indices
