"""Training a small glm5_next (the built-in demo model): corpus, tokenizer, differentiable forward, trainer."""
