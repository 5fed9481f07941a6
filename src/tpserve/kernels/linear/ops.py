"""The dense ops (registry.py): name -> (switch, torch reference, fast backends, launched under PDL). The dense
linear itself is a row of quant/dispatch.py's table."""

_REF = "tpserve.kernels.linear.ref"

OPS = {
    "swiglu": ("act", f"{_REF}:clamped_swiglu", {"triton": "tpserve.kernels.linear.act_triton:clamped_swiglu_triton"},
               True),
    "argmax_probability": ("argmax", f"{_REF}:argmax_and_probability",
                           {"triton": "tpserve.kernels.linear.argmax_triton:argmax_and_probability_triton"}, False),
}
