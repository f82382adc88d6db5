"""The executor: packed forward passes over a KV arena, and the schedulers of each model node."""
