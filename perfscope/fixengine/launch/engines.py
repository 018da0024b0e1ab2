"""Which serving engine a launch argv runs (SGLang, vLLM, perfscope's reproduction server), and where
its own arguments start."""

from __future__ import annotations

import os
from typing import Optional


def find_engine(argv: list[str]) -> Optional[tuple[str, int]]:
    """(engine, index of the first server argument) for a launch argv, or None."""
    for i, w in enumerate(argv):
        base = os.path.basename(w)
        if w == "-m" and i + 1 < len(argv):
            mod = argv[i + 1]
            if mod in ("sglang.launch_server", "sglang.srt.server"):
                return "sglang", i + 2
            if mod in ("vllm.entrypoints.openai.api_server", "vllm.entrypoints.api_server"):
                return "vllm", i + 2
            if mod in ("examples.repro_server", "repro_server"):
                return "repro", i + 2
        if base == "sglang" and i + 1 < len(argv) and argv[i + 1] == "serve":
            return "sglang", i + 2
        if base == "vllm" and i + 1 < len(argv) and argv[i + 1] == "serve":
            return "vllm", i + 2
        if base in ("launch_server.py",) and "sglang" in w:
            return "sglang", i + 1
    return None
