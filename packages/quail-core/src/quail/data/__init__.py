"""Where documents and their tokens come from."""
