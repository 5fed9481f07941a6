"""Shared test helpers: tiny checkpoints, the transformers oracle, full-prefill logits."""

from __future__ import annotations

import functools
from pathlib import Path

import torch

TINY_CONFIGS: dict[str, dict] = {
    # default layer schedule (KDA x3 + MLA), 8 layers: two MLA layers, MoE from layer 3, kpool 4
    "default": dict(layers=8, seed=1),
    # shared-indexer layers (an MLA layer reusing the previous one's top-k), kpool 8, group-limited routing
    "shared": dict(layers=6, seed=2, index_kpool=8, index_topk=16, n_group=2, topk_group=1, n_routed_experts=8,
                   layer_types=["linear_attention", "indexed_attention", "indexed_attention", "linear_attention",
                                "indexed_attention", "indexed_attention"],
                   indexer_types=["full", "full", "shared", "full", "full", "shared"]),
    # kpool 8 without the tail, softplus gate, attention bias, unnormalised top-k, tied embeddings
    "variant": dict(layers=4, seed=3, index_kpool=8, index_topk=24, index_kpool_always_select_tail=True,
                    linear_lower_bound=None, attention_bias=True, norm_topk_prob=False, n_shared_experts=2,
                    tie_word_embeddings=True),
}


def make_checkpoint(root: Path, name: str) -> Path:
    from tpserve.model.tiny import make_tiny

    spec = dict(TINY_CONFIGS[name])
    layers, seed = spec.pop("layers"), spec.pop("seed")
    return make_tiny(root / name, seed=seed, layers=layers, **spec)


@functools.lru_cache(maxsize=4)
def reference_model(path: str):
    import transformers
    from transformers import Glm5NextForConditionalGeneration

    transformers.logging.set_verbosity_error()
    model = Glm5NextForConditionalGeneration.from_pretrained(path, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None
    return model


def reference_greedy(path: Path, prompt: list[int], max_new_tokens: int) -> list[int]:
    model = reference_model(str(path))
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False,
                             pad_token_id=0)
    return out[0, len(prompt):].tolist()


def reference_logits(path: Path, prompt: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return reference_model(str(path))(input_ids=torch.tensor([prompt])).logits[0]


def prefill_logits(llm, prompt: list[int]) -> torch.Tensor:
    """Logits at every prompt position from one tpserve prefill (through the engine's runner)."""
    from tpserve.engine.runner import StepPlan

    engine = llm.engine
    bs = engine.executor.cache_shape.block_size
    blocks = engine.block_pool.allocate(-(-len(prompt) // bs))
    slot = engine.slot_pool.allocate(1)
    try:
        plan = StepPlan(list(prompt), list(range(len(prompt))), [0, len(prompt)], [0], slot, [blocks],
                        list(range(len(prompt))), list(slot))
        return engine.executor.execute(plan).cpu()
    finally:
        engine.block_pool.free(blocks)
        engine.slot_pool.free(slot)


def random_prompts(lengths, seed: int = 0, vocab: int = 500) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=gen).tolist() for n in lengths]


def wait_healthy(url: str, proc, timeout: float = 60.0) -> None:
    """Poll `url`/health until it answers 200; fail with the process output if it exits or times out."""
    import time

    import httpx

    deadline = time.time() + timeout
    while True:
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.time() > deadline:
            raise AssertionError("server did not come up:\n" + proc.stdout.read().decode()[-3000:])
        time.sleep(0.3)
