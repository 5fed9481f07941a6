"""Speculative decoding at temperature > 0: rejection sampling of draft tokens against the target.

For one draft position of n sequences: the draft token d was sampled from the draft distribution q;
accept it with probability min(1, p[d] / q[d]); when rejected, emit a token sampled from the residual
max(0, p - q) (normalised; from p when the residual is all zero). The emitted token is then
distributed exactly as p (Leviathan et al. 2023, Chen et al. 2023), whatever q is.

Randomness follows src/tpserve/engine/sampler.py: a row with a request seed draws from its own
generator, every other row from the engine's, and tokens are drawn with the exponential race
(argmax w / E, E ~ Exp(1), which needs no normalisation of w). Every row always draws the same
amount (one uniform, then V exponentials) whether or not it is accepted, so a seeded row's result
does not depend on the other rows of the batch. One device-to-host copy per call.
"""

from __future__ import annotations

import torch

from tpserve.model.h2d import to_device


def _check_generators(generators: list, n: int) -> None:
    if len(generators) != n:
        raise ValueError(f"generators: needs one entry per row ({n}), got {len(generators)}")


def _fill(t: torch.Tensor, kind: str, generator: torch.Generator) -> None:
    if kind == "exp":
        t.exponential_(generator=generator)
    else:
        t.uniform_(generator=generator)


def _draw(width: int, n: int, device: torch.device, generators: list, engine_generator: torch.Generator,
          kind: str) -> torch.Tensor:
    """[n, width] float32 draws, `kind` 'exp' (Exp(1)) or 'uniform' ([0, 1)): rows whose generator is
    None come from engine_generator in one batched draw, the others from their own generator."""
    shared = [i for i, g in enumerate(generators) if g is None]
    draws = torch.empty(len(shared), width, device=device)
    if shared:
        _fill(draws, kind, engine_generator)
        if len(shared) == n:
            return draws
    out = torch.empty(n, width, device=device)
    if shared:
        out[to_device(shared, device)] = draws
    for i, g in enumerate(generators):
        if g is not None:
            _fill(out[i], kind, g)
    return out


def _race(weights: torch.Tensor, generators: list, engine_generator: torch.Generator) -> torch.Tensor:
    """One token per row of non-negative (unnormalised) weights [n, V] -> [n] long on the device."""
    noise = _draw(weights.shape[1], weights.shape[0], weights.device, generators, engine_generator, "exp")
    return (weights / noise).argmax(-1)


def sample_tokens(probs: torch.Tensor, generators: list[torch.Generator | None],
                  engine_generator: torch.Generator) -> torch.Tensor:
    """Sample one token per row of probs [n, V] (row i from generators[i], or engine_generator when
    None) -> [n] long on probs' device, nothing copied to the host. Used for the drafts."""
    if probs.dim() != 2:
        raise ValueError(f"probs: expected [n, V], got shape {tuple(probs.shape)}")
    _check_generators(generators, probs.shape[0])
    if probs.shape[0] == 0:
        return torch.empty(0, dtype=torch.long, device=probs.device)
    return _race(probs, generators, engine_generator)


def sample_from(probs: torch.Tensor, generators: list[torch.Generator | None],
                engine_generator: torch.Generator) -> list[int]:
    """`sample_tokens` as a host list."""
    return sample_tokens(probs, generators, engine_generator).tolist()


def rejection_verify(p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor,
                     generators: list[torch.Generator | None], engine_generator: torch.Generator
                     ) -> tuple[list[bool], list[int]]:
    """One draft position for n sequences. p [n, V]: target probabilities (already processed:
    temperature, top-k/p, penalties); q [n, V]: the draft probabilities the draft token was sampled
    from; drafts [n] long. Returns (accepted, token), token = the draft when accepted, else a sample
    of the residual. Row i draws from generators[i] when not None, else from engine_generator, on
    p's device. Raises ValueError for bad shapes, dtypes, devices or draft ids outside [0, V)."""
    accept, token, bad = rejection_tokens(p, q, drafts, generators, engine_generator)
    if accept.numel() == 0:
        return [], []
    host = torch.stack([accept.long(), token, bad.long()]).tolist()  # the one device-to-host copy
    if any(host[2]):
        raise ValueError(f"drafts: ids must be in [0, {p.shape[1]}), row {host[2].index(1)} is not")
    return [bool(a) for a in host[0]], host[1]


def rejection_tokens(p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor,
                     generators: list[torch.Generator | None], engine_generator: torch.Generator
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`rejection_verify` on the device, nothing copied to the host: (accepted [n] bool, token [n] long, bad [n]
    bool: the draft id was outside [0, V), its row's result meaningless). The same checks of shapes, dtypes
    and devices, the same draws."""
    if p.dim() != 2:
        raise ValueError(f"p: expected [n, V], got shape {tuple(p.shape)}")
    if q.shape != p.shape:
        raise ValueError(f"q: expected the shape of p {tuple(p.shape)}, got {tuple(q.shape)}")
    if q.device != p.device:
        raise ValueError(f"q: expected p's device {p.device}, got {q.device}")
    n, vocab = p.shape
    if drafts.shape != (n,):
        raise ValueError(f"drafts: expected shape ({n},), got {tuple(drafts.shape)}")
    if drafts.dtype != torch.long:
        raise ValueError(f"drafts: expected dtype torch.long, got {drafts.dtype}")
    _check_generators(generators, n)
    if n == 0:
        empty = torch.empty(0, dtype=torch.long, device=p.device)
        return empty.bool(), empty, empty.bool()
    d = drafts.to(p.device)
    bad = (d < 0) | (d >= vocab)
    idx = d.clamp(0, vocab - 1).unsqueeze(1)
    p_d, q_d = p.gather(1, idx).squeeze(1), q.gather(1, idx).squeeze(1)
    u = _draw(1, n, p.device, generators, engine_generator, "uniform").squeeze(1)
    # u < p/q without dividing: accepts with probability min(1, p/q) (u < 1), and when q[d] = 0
    # (the draft could not have been drawn) accepts iff p[d] > 0.
    accept = u * q_d < p_d
    residual = (p - q).clamp_min(0)
    empty = residual.sum(-1, keepdim=True) <= 0
    residual = torch.where(empty, p, residual)
    return accept, torch.where(accept, d, _race(residual, generators, engine_generator)), bad
