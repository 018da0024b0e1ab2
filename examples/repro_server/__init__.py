"""A small MLA decode server (torch) that reproduces SGLang's FP8 KV whole-pool cast, speaking the
subset of SGLang's HTTP API that perfscope uses. Start: ``python -m examples.repro_server``."""
