"""quail-sglang: the SGLang request backend."""
