"""Token ids perfscope's load may send: always inside what the served model accepts.

A server embeds each prompt id with a table of ``vocab_size`` rows; an id past it crashes the
scheduler (real SGLang 0.5.23: ``IndexError: index out of range in self`` in the embedding, and the
whole server exits). Neither SGLang's ``/server_info`` / ``/model_info`` nor vLLM's ``/v1/models``
carry the vocabulary size, so it is read from the model's own ``config.json`` where perfscope can
reach it: on the server's host over SSH (``--host``), or on this machine when the server's URL is
a loopback address (``--url http://127.0.0.1:...``) and ``model_path`` is a folder here. Anything
else (a hub name, a remote URL, no config) gets ids every tokenizer has: :data:`SAFE_IDS`, below
256 (each byte-level BPE has its 256 byte tokens first; SentencePiece models their byte fallbacks
at 3..258), above the usual special ids.
"""

from __future__ import annotations

import ipaddress
import json
import posixpath
from typing import Any, Optional
from urllib.parse import urlsplit

SAFE_IDS = (100, 256)  # [lo, hi): ids every real tokenizer has
MAX_HI = 10_000  # with a known vocabulary: ids from [1, min(vocab, MAX_HI))
_CONFIG_LIMIT = 4_000_000  # bytes of config.json read at most


def vocab_of(config: Any) -> Optional[int]:
    """``vocab_size`` of a Hugging Face config (top level, or its ``text_config`` /
    ``llm_config`` for multimodal models); None when it has none."""
    if not isinstance(config, dict):
        return None
    for c in (config, config.get("text_config"), config.get("llm_config"), config.get("language_config")):
        if isinstance(c, dict):
            v = c.get("vocab_size") or c.get("padded_vocab_size")
            if isinstance(v, int) and not isinstance(v, bool) and v > 2:
                return v
    return None


def is_loopback_url(url: Optional[str]) -> bool:
    if not url:
        return False
    host = urlsplit(url if "://" in url else "http://" + url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def read_model_config(io, model_path: Any) -> Optional[dict]:
    """The model's ``config.json`` read through ``io`` (a :class:`perfscope.remote.hostio.HostIO`
    on the server's host), or None: no folder path, no file, not JSON, or the read failed."""
    if io is None or not isinstance(model_path, str) or not model_path.startswith("/"):
        return None
    path = posixpath.join(model_path, "config.json")
    try:
        r = io.run(["head", "-c", str(_CONFIG_LIMIT), "--", path], timeout=30)
    except Exception:  # noqa: BLE001 - a config we cannot read only means the safe ids
        return None
    if not getattr(r, "ok", False) or not r.stdout.strip():
        return None
    try:
        cfg = json.loads(r.stdout)
    except ValueError:
        return None
    return cfg if isinstance(cfg, dict) else None


def token_ids(info: Optional[dict], io=None) -> tuple[tuple[int, int], str]:
    """([lo, hi) of the load's prompt ids, where it came from). ``io`` reads files on the server's
    host (None: no access, the safe ids)."""
    model_path = (info or {}).get("model_path")
    vocab = vocab_of(read_model_config(io, model_path))
    if vocab and isinstance(model_path, str):  # a vocab implies the config read from model_path
        return (1, min(vocab, MAX_HI)), f"vocab {vocab} from {posixpath.join(model_path, 'config.json')}"
    return SAFE_IDS, f"ids {SAFE_IDS[0]}..{SAFE_IDS[1] - 1} (the model's config.json is not reachable)"
