"""fp8-kv-cast: stop converting the whole FP8 MLA KV pool to BF16 in every layer of every step.

Targets (see README.md beside this file for the design and the risks):

* ``sglang-flashinfer-mla``: ``sglang/srt/layers/attention/flashinfer_mla_backend.py``,
  0.4.6.post5 - 0.5.23, strategies ``native`` and ``pages``;
* ``sglang-fa3``: ``sglang/srt/layers/attention/flashattention_backend.py`` (absorbed-MLA path),
  0.4.10.post2 - 0.5.23, strategy ``pages``;
* ``repro-server``: ``examples/repro_server/mla_attention.py`` (perfscope's reproduction server,
  written like SGLang 0.5.14+), strategies ``native`` and ``pages``.

Everything is anchored on code structure (``ast``): the cast statements in ``forward_extend`` /
``forward_decode`` of the attention backend class, the dtype arguments given to ``plan()`` in the
indices updaters, and the ``run()`` calls that consume the cast. A file whose structure is not one
of the known variants is refused, never patched by guess.

Where things are (one module per concern; the class below only delegates):

* ``targets.py``: the three targets, the patched-file markers, which target a server or file is;
* ``preconditions.py``: whether the fix applies (FP8 KV, backend) and the strategy choice with its
  requirements (GPU arch, FlashInfer version, kv dtype, model dtype);
* ``detection.py``: variant detection (known structures, anchors), refusals;
* ``shapes.py``: the ``ast`` helpers detection and the post-conditions read the code with;
* ``transform.py``: the edits, the helper block (``snippet.py``) and the post-conditions;
* ``probe_script.py``: run on the host by ``perfscope fix --check``; ``snippet.py``: inserted code.
"""

from __future__ import annotations

from typing import Optional

from perfscope.fixengine.model import Detection, Environment, FixModule, StrategyChoice, TargetSpec

from .detection import detect as _detect
from .preconditions import applicable as _applicable, choose_strategy as _choose_strategy
from .targets import target_for as _target_for, target_for_file as _target_for_file
from .transform import postconditions as _postconditions, transform as _transform

# re-exported: the names this module defined before it was split (tests read MLA, FA3, END_MARKER)
from .detection import FA3_VARIANTS, MLA_VARIANTS, REFUSED_RANGE, TESTED_MAX  # noqa: F401
from .preconditions import FP8_KV, NATIVE_FA2_MIN_FLASHINFER, NATIVE_MIN_FLASHINFER  # noqa: F401
from .targets import END_MARKER, FA3, MARKER, MLA, REPRO, TARGETS  # noqa: F401
from .transform import HERE, SNIPPET  # noqa: F401


class Fp8KvCast(FixModule):
    id = "fp8-kv-cast"
    title = "Stop converting the whole FP8 MLA KV pool to BF16 every layer"
    answers = ("fp8-kv-cast",)
    targets = TARGETS
    strategies = ("native", "pages")
    requirements = {
        "native": "SM90 (H100/H200) GPU, FlashInfer >= 0.6.14 (fa3; >= 0.6.18 also fa2), "
        "kv_cache_dtype fp8_e4m3, BF16 model; run() gets ckv_scale=kpe_scale=1.0",
        "pages": "any GPU and FlashInfer; Triton (SGLang depends on it) for the CUDA-graph-safe "
        "row conversion; scratch memory = one layer of the pool in BF16",
    }
    marker = MARKER

    def target_for(self, env: Environment, name: Optional[str]) -> TargetSpec:
        return _target_for(env, name)

    def target_for_file(self, data: bytes) -> TargetSpec:
        """Which target a file given by path is, from its content."""
        return _target_for_file(data)

    def applicable(self, env: Environment, target: TargetSpec) -> Optional[str]:
        return _applicable(env, target)

    def detect(self, target: TargetSpec, data: bytes, env: Environment) -> Detection:
        return _detect(target, data, env)

    def choose_strategy(
        self, target: TargetSpec, det: Detection, env: Environment, requested: str = "auto"
    ) -> StrategyChoice:
        return _choose_strategy(target, det, env, requested)

    def transform(self, target: TargetSpec, det: Detection, data: bytes, strategy: str) -> tuple[bytes, list]:
        return _transform(target, det, data, strategy)

    def postconditions(
        self, target: TargetSpec, det: Detection, before: bytes, after: bytes, strategy: str
    ) -> list[str]:
        return _postconditions(target, det, before, after, strategy)


FIX = Fp8KvCast()
