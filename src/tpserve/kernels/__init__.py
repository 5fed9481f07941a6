"""GPU kernels and their torch references, a sub-package per subject: attention, moe, quant, norms, linear, launch.
Naming rule: in a subject, torch references in `ref.py` (or `<op>.py`), each fast backend in `<what>_<backend>.py`
(backend: triton, cuda or fla), the subject's op registrations in `ops.py`. registry.py resolves the switches into
the ops a model runs; quant/dispatch.py holds the one table that picks a linear's or the experts' kernel."""
