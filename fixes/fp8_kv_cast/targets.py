"""What fp8-kv-cast patches: the three targets, the markers of a patched file, and which target
a server or a file is."""

from __future__ import annotations

from typing import Optional

from perfscope.fixengine.model import Environment, TargetSpec

MARKER = "# >>> perfscope fp8-kv-cast >>>"
END_MARKER = "# <<< perfscope fp8-kv-cast <<<"

MLA = TargetSpec(
    name="sglang-flashinfer-mla",
    relpath="srt/layers/attention/flashinfer_mla_backend.py",
    versions="0.4.6.post5 - 0.5.23 (0.4.6 - 0.4.6.post4 refused: sglang#5651)",
    strategies=("native", "pages"),
    backends=("flashinfer",),
    description="SGLang's FlashInfer MLA backend (forward_decode, forward_extend, plan() dtypes)",
)
FA3 = TargetSpec(
    name="sglang-fa3",
    relpath="srt/layers/attention/flashattention_backend.py",
    versions="0.4.10.post2 - 0.5.23 (0.4.6.post5 does not cast: not applicable)",
    strategies=("pages",),
    backends=("fa3",),
    description="SGLang's FA3 backend, absorbed-MLA path (forward_decode, forward_extend)",
)
REPRO = TargetSpec(
    name="repro-server",
    relpath=None,
    versions="perfscope examples/repro_server (SGLang 0.5.14+ shape)",
    strategies=("native", "pages"),
    backends=("flashinfer", "torch"),
    description="perfscope's reproduction server attention module (examples/repro_server/mla_attention.py)",
)

TARGETS = (MLA, FA3, REPRO)


def target_for(env: Environment, name: Optional[str]) -> TargetSpec:
    if name:
        for t in TARGETS:
            if t.name == name:
                return t
        raise KeyError(name)
    backend = (env.decode_attention_backend or env.attention_backend or "").lower()
    if backend == "fa3":
        return FA3
    return MLA


def target_for_file(data: bytes) -> TargetSpec:
    """Which target a file given by path is, from its content."""
    text = data.decode("utf-8", "replace")
    if "class FlashAttentionBackend" in text:
        return FA3
    if "class FlashInferMLAAttnBackend" in text and "TorchMLAPagedAttentionWrapper" in text:
        return REPRO
    return MLA
