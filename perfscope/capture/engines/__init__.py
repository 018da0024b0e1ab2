"""The serving engines ``perfscope trace`` and ``perfscope bench`` drive, one adapter module each
(:class:`~perfscope.capture.engines.base.Engine`): ``ENGINES`` by name, ``get(name)``, ``choices()``.
A new engine is a module beside ``sglang.py`` and ``vllm.py`` and its line in ``ENGINES``."""

from __future__ import annotations

from perfscope.capture.engines.base import Engine, RemoteDir, Server, version_tuple
from perfscope.capture.engines.sglang import SGLang
from perfscope.capture.engines.vllm import VLLM
from perfscope.errors import InputError

ENGINES: dict[str, Engine] = {e.name: e for e in (SGLang(), VLLM())}
DEFAULT = "sglang"


def choices() -> list[str]:
    """The engine names, in the order --help lists them."""
    return list(ENGINES)


def get(name: str) -> Engine:
    """The engine called ``name`` (any case); InputError naming the choices for any other."""
    engine = ENGINES.get(str(name).lower())
    if engine is None:
        raise InputError(f"--engine {str(name).lower()}: expected {' or '.join(choices())}")
    return engine


__all__ = ["DEFAULT", "ENGINES", "Engine", "RemoteDir", "Server", "choices", "get", "version_tuple"]
