"""The norm and mHC ops (registry.py): name -> (switch, torch reference, fast backends, launched under PDL)."""

_REF, _NORM = "tpserve.kernels.norms.ref", "tpserve.kernels.norms.norm_triton"

OPS = {
    "rms_norm": ("norm", f"{_REF}:rms_norm", {"triton": f"{_NORM}:rms_norm"}, True),
    "gated_rms_norm": ("norm", f"{_REF}:gated_rms_norm", {"triton": f"{_NORM}:gated_rms_norm"}, True),
    "hc_stream_norm": ("norm", f"{_REF}:hc_stream_norm", {"triton": f"{_NORM}:rms_normalize"}, True),
    "hc_collapse": ("norm", f"{_REF}:hc_collapse", {"triton": f"{_NORM}:hc_collapse"}, True),
    "hc_expand": ("norm", f"{_REF}:hc_expand", {"triton": f"{_NORM}:hc_expand"}, True),
    "hc_weights": ("mhc", "tpserve.kernels.norms.mhc:hc_weights_torch",
                   {"triton": "tpserve.kernels.norms.mhc_triton:hc_weights_triton"}, True),
    # prefill steps' stream norm + projection in one kernel; its torch form is hc_stream_norm then F.linear
    "hc_project": ("mhc_project", None, {"triton": "tpserve.kernels.norms.hc_project_triton:hc_project"}, False),
}
