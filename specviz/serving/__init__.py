"""Speculative decoding where it is served: read vLLM, llama.cpp, SGLang and TensorRT-LLM servers' Prometheus
counters (prometheus), watch them live (watch), send a prompt file through a server's OpenAI-compatible API (probe),
start a local llama-server for tests (server), export a target and its drafters into the layouts the engines load
(engine_export) and serve them for real (engines). `export` is specviz's own /metrics page. Torch-free but for
engine_export, which imports torch when called."""
