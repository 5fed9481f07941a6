"""Shared test helpers: tiny checkpoints, the transformers oracle, full-prefill logits."""

from __future__ import annotations

import functools
import importlib.util
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
    # kpool 8 with the tail, softplus gate, attention bias, unnormalised top-k, tied embeddings
    "variant": dict(layers=4, seed=3, index_kpool=8, index_topk=24, index_kpool_always_select_tail=True,
                    linear_lower_bound=None, attention_bias=True, norm_topk_prob=False, n_shared_experts=2,
                    tie_word_embeddings=True),
    # the indexer's no-tail branch: a query sees only complete pools (plus itself through its pool)
    "notail": dict(layers=4, seed=4, index_kpool=4, index_topk=12, index_kpool_always_select_tail=False),
    # with an MTP layer (layer 4, the published layout), every tensor random: drafts are rarely accepted
    "mtp_random": dict(layers=4, seed=6, mtp=True),
    # with an MTP layer whose drafts the model often accepts (`_agreeable_drafter`): speculative decoding's
    # mechanics (accepted runs, stops inside them, rejections) on a checkpoint in the published layout
    "mtp": dict(layers=4, seed=5, mtp=True, agree=0.1),
}


def make_checkpoint(root: Path, name: str) -> Path:
    from tpserve.model.tiny import make_tiny

    spec = dict(TINY_CONFIGS[name])
    layers, seed, agree = spec.pop("layers"), spec.pop("seed"), spec.pop("agree", None)
    path = make_tiny(root / name, seed=seed, layers=layers, **spec)
    if agree is not None:
        _agreeable_drafter(path, layers, agree)
    return path


def _agreeable_drafter(path: Path, mtp_layer: int, scale: float) -> None:
    """Rewrite a tiny checkpoint so that its MTP layer often drafts what the model then emits: every block's
    output projection (o_proj, down_proj) scaled by `scale`, so the model's hidden state at a position is
    mostly its token's embedding; the drafter then maps the embedding of the next token through the same norm
    weight (eh_proj = [I | small], enorm = 1, shared_head.norm = the final norm) and predicts the token after
    it about as the model will. The blocks still move the logits (about half the drafts are rejected)."""
    import re

    from safetensors.torch import load_file, save_file

    file = path / "model.safetensors"
    t = load_file(str(file))
    for k in t:
        if re.search(r"\.(o_proj|down_proj)\.weight$", k):
            t[k] = t[k] * scale
    p = f"model.language_model.layers.{mtp_layer}."
    d = t[p + "enorm.weight"].shape[0]
    small = torch.randn(d, d, generator=torch.Generator().manual_seed(0)) * (0.1 / d ** 0.5)
    t[p + "eh_proj.weight"] = torch.cat([torch.eye(d), small], dim=1)
    t[p + "enorm.weight"] = torch.ones(d)
    t[p + "shared_head.norm.weight"] = t["model.language_model.norm.weight"].clone()
    save_file(t, str(file), metadata={"format": "pt"})


@functools.lru_cache(maxsize=8)
def reference_model(path: str, dtype: torch.dtype = torch.float32):
    import transformers
    from transformers import Glm5NextForConditionalGeneration

    transformers.logging.set_verbosity_error()
    # the grouped-mm experts path has no float64 kernel; the eager loop is the same function
    extra = {"experts_implementation": "eager"} if dtype == torch.float64 else {}
    model = Glm5NextForConditionalGeneration.from_pretrained(path, dtype=dtype, **extra).eval()
    model.generation_config.eos_token_id = None
    return model


def reference_greedy(path: Path, prompt: list[int], max_new_tokens: int) -> list[int]:
    return list(_reference_greedy(str(path), tuple(prompt), max_new_tokens))


def reference_logits(path: Path, prompt: list[int], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return _reference_logits(str(path), tuple(prompt), dtype).clone()


# the reference's results per (checkpoint, prompt): tests that check several engines against the same ones
# run transformers once
@functools.lru_cache(maxsize=64)
def _reference_greedy(path: str, prompt: tuple[int, ...], max_new_tokens: int) -> tuple[int, ...]:
    model = reference_model(path, torch.float32)
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False,
                             pad_token_id=0)
    return tuple(out[0, len(prompt):].tolist())


@functools.lru_cache(maxsize=64)
def _reference_logits(path: str, prompt: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    with torch.no_grad():
        return reference_model(path, dtype)(input_ids=torch.tensor([prompt])).logits[0]


FP32_EPS = torch.finfo(torch.float32).eps  # unit roundoff u = eps / 2


def oracle_bound(path: Path, prompt: list[int], factor: float = 8.0) -> tuple[float, torch.Tensor]:
    """(bound on |our fp32 logits - exact logits|, the exact logits: transformers in float64).

    Both we and transformers' fp32 model approximate the same function; its float64 evaluation is
    the truth. transformers' own fp32 error on this machine, e_ref = |ref32 - ref64|, measures how
    much rounding this computation accumulates here (it scales with the CPU's BLAS and summation
    order, which is why a fixed 1e-4 failed at 1.018e-4 on another CPU). The bound is
        factor * e_ref + 64 * u * max|ref64|
    i.e. no more than `factor` times the reference's own rounding error, plus a floor of 64 unit
    roundoffs of the logit scale for the case where the reference happens to round luckily.
    A wrong computation moves logits by orders of magnitude more. Log-softmax values move by at
    most twice the largest logit error."""
    ref32 = reference_logits(path, prompt).double()
    ref64 = reference_logits(path, prompt, torch.float64)
    e_ref = (ref32 - ref64).abs().max().item()
    return factor * e_ref + 64 * (FP32_EPS / 2) * ref64.abs().max().item(), ref64


def assert_logits_match_oracle(ours: torch.Tensor, path: Path, prompt: list[int], factor: float = 8.0) -> float:
    """Our fp32 logits within oracle_bound of the exact function. Returns the error."""
    bound, ref64 = oracle_bound(path, prompt, factor)
    err = (ours.double() - ref64).abs().max().item()
    assert err <= bound, f"logits differ from the float64 oracle by {err:.3e} > bound {bound:.3e}"
    return err


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


def load_bench(name: str):
    """A script of bench/ (not a package) imported as a module, for tests of its pieces."""
    path = Path(__file__).resolve().parents[1] / "bench" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


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
            out = proc.stdout.read()  # bytes, or str where the caller opened the pipe in text mode
            out = out.decode() if isinstance(out, bytes) else out
            raise AssertionError("server did not come up:\n" + out[-3000:])
        time.sleep(0.3)
