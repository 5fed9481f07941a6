"""The neighbour-only ring all-reduce inside the model: TP=3 on CPU gives the same greedy tokens
and bitwise the same prefill logits with --allreduce-topology ring as with mesh (the ring adds in
the mesh's order), and the tokens of transformers."""

from helpers import prefill_logits, random_prompts, reference_greedy
from tpserve import LLM, SamplingParams

PARAMS = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


def _run(path, topology, prompts):
    llm = LLM(str(path), device="cpu", kv_cache_memory="8MiB", block_size=16,
              tensor_parallel_size=3, max_num_batched_tokens=64, sequence_parallel=False,
              allreduce_topology=topology)
    try:
        assert llm.engine.ecfg.allreduce_topology == topology
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], PARAMS)
        return [o.outputs[0].token_ids for o in outs], prefill_logits(llm, prompts[1])
    finally:
        llm.shutdown()


def test_ring_topology_gives_the_mesh_results_bit_for_bit(tiny):
    path = tiny("default")
    prompts = random_prompts((9, 40), seed=5)
    mesh_tokens, mesh_logits = _run(path, "mesh", prompts)
    ring_tokens, ring_logits = _run(path, "ring", prompts)
    assert ring_tokens == mesh_tokens
    assert ring_tokens[0] == reference_greedy(path, prompts[0], 6)
    assert bool((ring_logits == mesh_logits).all())
