"""The attention ops (registry.py): name -> (switch, torch reference, fast backends, launched under PDL). No
reference (None): the layer's own torch code is the path where the switch says torch (model/kda.py,
model/indexer.py, model/mla.py). KDA's recurrences (`kda`: torch or fla, kda_fla.py) are one family the layer
takes as a whole, and fall back per device after its self-test (engine/runner.py)."""

_PREP, _INDEX = "tpserve.kernels.attention.kda_prep_triton", "tpserve.kernels.attention.indexer_triton"

OPS = {
    "kda_conv_rows": ("kda_prep", None, {"triton": f"{_PREP}:conv_rows"}, True),
    "kda_conv_chunk": ("kda_prep", None, {"triton": f"{_PREP}:conv_chunk"}, False),
    "kda_gate_beta": ("kda_prep", "tpserve.kernels.attention.kda:gate_beta", {"triton": f"{_PREP}:gate_beta"}, True),
    "fill_pools": ("indexer", None, {"triton": f"{_INDEX}:fill_pools"}, False),
    "pool_scores": ("indexer", None, {"triton": f"{_INDEX}:decode_scores"}, False),
    "expand_selection": ("indexer", None, {"triton": f"{_INDEX}:expand_selection"}, False),
    "top_pools": ("indexer_topk", "tpserve.kernels.attention.indexer:top_pools", {"triton": f"{_INDEX}:top_pools"},
                  False),
    "sparse_mla": ("mla_decode", None, {"triton": "tpserve.kernels.attention.mla_triton:sparse_mla"}, False),
}
