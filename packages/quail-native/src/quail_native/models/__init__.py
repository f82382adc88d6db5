"""Model architectures in torch, and how to load them."""
