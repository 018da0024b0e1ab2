"""Reaching a server and its host: SSH transport (ssh/), the host's files and commands over SSH or
on this machine (hostio/), bounded HTTP exchanges (httpbound.py), and the SGLang and vLLM HTTP
clients (sglang_api/, vllm_api.py). Imports nothing of perfscope above util/ and errors.py."""
