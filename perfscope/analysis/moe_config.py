"""Which tuned fused-MoE config SGLang loads, by SGLang's own rules (0.5.13.post1 - 0.5.23).

SGLang's ``fused_moe_triton_config.get_moe_configs`` looks for
``$SGLANG_MOE_CONFIG_DIR`` (default: the folder of the loader,
``sglang/srt/layers/moe/moe_runner/triton_utils``) ``/configs/triton_<X_Y_Z>/<name>``, the Triton
version's dots as underscores, with ``<name>`` =
``E={E},N={N},device_name={torch device name, spaces as _}[,dtype=..][,block_shape=[n, k]]
[,per_channel_quant=True][_down].json``; E = the experts of the layer's weights on this rank, N =
``w2.shape[2]``, the expert intermediate size on this rank (moe_intermediate_size / MoE TP). The
exact Triton version first, then every other ``triton_*`` folder newest first (a "Fallback to triton
version" warning); none: "Using default MoE kernel config". The file maps batch sizes (tokens) to
``{BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, GROUP_SIZE_M, num_warps, num_stages}``; SGLang takes the
entry whose key is nearest the batch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Optional

LOADER_RELDIR = "srt/layers/moe/moe_runner/triton_utils"  # inside the sglang package
CONFIG_KEYS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages")


def config_file_name(
    E: int,
    N: int,
    device_name: str,
    dtype: Optional[str] = None,
    block_shape: Optional[list] = None,
    per_channel_quant: bool = False,
    down: bool = False,
) -> str:
    dev = device_name.replace(" ", "_")
    d = f",dtype={dtype}" if dtype else ""
    b = f",block_shape={list(block_shape)}" if block_shape and all(block_shape) else ""
    p = ",per_channel_quant=True" if per_channel_quant else ""
    return f"E={E},N={N},device_name={dev}{d}{b}{p}{'_down' if down else ''}.json"


def version_dir(triton_version: str) -> str:
    return "triton_" + triton_version.replace(".", "_")


def _vkey(d: str) -> tuple:
    try:
        return tuple(int(x) for x in d[len("triton_") :].split("_"))
    except ValueError:
        return (-1,)


def lookup(version_dirs: Iterable[str], exists, name: str, triton_version: str) -> tuple[str, Optional[str]]:
    """SGLang's search over ``configs/``: ("exact" | "fallback" | "default", the folder it loads from).
    ``version_dirs``: the ``triton_*`` folders there; ``exists(folder, name)``: whether the file is there."""
    want = version_dir(triton_version)
    if exists(want, name):
        return "exact", want
    for d in sorted((d for d in version_dirs if d.startswith("triton_") and d != want), key=_vkey, reverse=True):
        if exists(d, name):
            return "fallback", d
    return "default", None


_LOG = (
    (
        "default",
        re.compile(
            r"Using default MoE kernel config\. Performance might be sub-optimal! Config file not "
            r"found at (\S+?),? you can create"
        ),
    ),
    (
        "fallback",
        re.compile(
            r"Config file not found at (\S+?)\. Fallback to triton version (\S+) and use MoE kernel "
            r"config from (\S+?)\. "
        ),
    ),
    ("exact", re.compile(r"Using MoE kernel config from (\S+?)\.\s*$", re.M)),
)


LOG_TAIL_BYTES = 32 << 20  # a server log is read from its last 32 MiB


def read_log(path) -> str:
    """The tail of a server log as text (bounded); one-line InputError when it cannot be read."""
    import os

    from perfscope.errors import InputError

    try:
        with open(path, "rb") as f:
            if not os.path.isfile(path):
                raise InputError(f"--server-log {path}: not a regular file")
            size = os.fstat(f.fileno()).st_size
            f.seek(max(0, size - LOG_TAIL_BYTES))
            return f.read(LOG_TAIL_BYTES).decode("utf-8", "replace")
    except FileNotFoundError:
        raise InputError(f"--server-log {path}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"--server-log {path}: not a regular file") from None
    except OSError as e:
        raise InputError(f"--server-log {path}: cannot read ({e.strerror or e})") from None


@dataclass
class LogLine:
    kind: str  # "default" | "fallback" | "exact"
    path: str  # the file SGLang wanted (default, fallback) or loaded (exact)
    used: Optional[str] = None  # fallback: the file it loaded instead


def scan_log(text: str) -> list[LogLine]:
    """SGLang's fused-MoE config lines of a server log, in order (one per distinct file)."""
    out: list[LogLine] = []
    seen = set()
    for kind, rx in _LOG:
        for m in rx.finditer(text):
            line = LogLine(kind, m.group(1), m.group(3) if kind == "fallback" else None)
            if (kind, line.path) not in seen:
                seen.add((kind, line.path))
                out.append(line)
    return out


@dataclass
class MoeShape:
    experts: int  # E of the weights on one rank
    top_k: int
    hidden: int
    intermediate: int  # N: per rank
    moe_layers: int

    def flops_per_token(self) -> float:
        """FLOPs of the two expert GEMMs per token per MoE layer: w13 [2N, hidden] and w2 [hidden, N], top-k."""
        return 2.0 * self.top_k * (self.hidden * 2 * self.intermediate + self.intermediate * self.hidden)


def _int(mc: dict, *keys) -> Optional[int]:
    for k in keys:
        v = mc.get(k)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None


def moe_shape(mc: dict, tp: int = 1, ep: int = 1) -> Optional[MoeShape]:
    """The fused-MoE weights' shape on one rank from a HF config.json (DeepSeek, Qwen-MoE, Mixtral)."""
    if not isinstance(mc, dict):
        return None
    text_config = mc.get("text_config")
    if isinstance(text_config, dict):
        mc = text_config
    e = _int(mc, "n_routed_experts", "num_experts", "num_local_experts")
    k = _int(mc, "num_experts_per_tok", "moe_topk", "top_k")
    h = _int(mc, "hidden_size")
    n = _int(mc, "moe_intermediate_size", "intermediate_size")
    layers = _int(mc, "num_hidden_layers")
    if not (e and k and h and n and layers):
        return None
    dense = _int(mc, "first_k_dense_replace") or 0
    freq = _int(mc, "moe_layer_freq", "decoder_sparse_step") or 1
    moe_layers = sum(1 for i in range(dense, layers) if (i - dense) % freq == 0) if freq > 1 else layers - dense
    ep = max(ep, 1)
    moe_tp = max(tp // ep, 1)
    return MoeShape(experts=e // ep, top_k=k, hidden=h, intermediate=n // moe_tp, moe_layers=moe_layers)
