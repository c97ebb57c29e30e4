"""What `make vllm` runs beside vLLM: its venv, the wrong reserves it must catch, the comparisons."""
