"""MTP drafting measured with a plain torch loop over the training forward (no cache, greedy).

Each round: one main-model forward over the accepted tokens plus the pending drafts verifies the
drafts (a draft is accepted while it equals the main model's greedy token) and yields one more
token from the main model; then the MTP head drafts the next k tokens by chaining its depths:
depth d at position p-1 reads the depth d-1 hidden states and the token at p-1+d (the tokens
past the accepted ones are the earlier drafts). The output is always the main model's own
greedy continuation; the drafts only change how many tokens each forward confirms.
"""

from __future__ import annotations

import torch

from tpserve.train.model import TrainModel


@torch.no_grad()
def draft_and_verify(model: TrainModel, prompt: list[int], *, max_new_tokens: int, k: int,
                     stop_ids: set[int] | frozenset[int] = frozenset()) -> dict:
    """-> {"tokens": greedy continuation, "drafted": drafts proposed, "accepted": drafts accepted,
    "rounds": main-model forwards}."""
    if k < 0:
        raise ValueError(f"k: must be >= 0, got {k}")
    seq = list(prompt)
    drafts: list[int] = []
    drafted = accepted = rounds = 0
    n_prompt = len(prompt)
    while True:
        out = model(torch.tensor([seq + drafts]))
        rounds += 1
        greedy = out.logits[0, len(seq) - 1:].argmax(-1).tolist()      # main model's token after each prefix
        n_ok = 0
        while n_ok < len(drafts) and drafts[n_ok] == greedy[n_ok]:
            n_ok += 1
        accepted += n_ok
        new = drafts[:n_ok] + [greedy[n_ok]]
        done = False
        for tok in new:
            seq.append(tok)
            if tok in stop_ids or len(seq) - n_prompt >= max_new_tokens:
                done = True
                break
        if done:
            break
        drafts = []
        if k == 0:
            continue
        p = len(seq) - 1                                                  # position of the newest token
        hidden = out.hidden[:, :p]                                        # depth 0, positions 0..p-1
        ext = list(seq)
        for d in range(1, k + 1):
            next_ids = torch.tensor([ext[d:p + d]])
            hidden, logits = model.mtp_step(hidden, next_ids)
            tok = int(logits[0, p - 1].argmax())
            drafts.append(tok)
            ext.append(tok)
        drafted += k
    return {"tokens": seq[n_prompt:], "drafted": drafted, "accepted": accepted, "rounds": rounds}
