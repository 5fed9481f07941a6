"""The MoE ops (registry.py): name -> (switch, torch reference, fast backends, launched under PDL). The experts
themselves are quant/dispatch.py's table."""

OPS = {
    "route": ("moe_route", "tpserve.kernels.moe.route:route", {"triton": "tpserve.kernels.moe.route_triton:route"},
              True),
}
