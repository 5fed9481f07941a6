"""GPU kernels and their torch references, a sub-package per subject: attention, moe, quant, norms, linear, launch.
Naming rule: in a subject, the torch references live in `ref.py` (or `<op>.py`), each fast backend in
`<what>_<backend>.py` (backend: triton, cuda or fla), and the subject's ops are registered in its `ops.py`;
registry.py resolves the switches (choice.Kernels) into the ops a model runs, quant/dispatch.py the linears' and
experts' kernels."""
