"""Speculative decoding where it is served: read vLLM, llama.cpp, SGLang and TensorRT-LLM servers' Prometheus
counters (metrics), watch them live (watch), send a prompt file through a server's OpenAI-compatible API (probe),
and start a local llama-server for tests (server). Torch-free."""
