"""quail-vllm: the vLLM request backend."""
