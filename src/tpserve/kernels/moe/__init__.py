"""Routed experts: routing, the expert-sorted layout, the grouped kernels and the combine of the choices."""
