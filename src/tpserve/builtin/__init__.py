"""Checkpoints shipped with tpserve: glm5-next-demo, the small glm5_next trained by `tpserve train-demo`."""
