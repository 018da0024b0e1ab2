"""Real SGLang attention-backend sources from released wheels, fetched by the test suite.

``sglang_file(version, relpath)`` runs ``pip download --no-deps sglang==VERSION`` once into
``~/.cache/perfscope-tests/sglang-wheels`` (or ``$PERFSCOPE_TEST_CACHE``) and extracts the named file
from the wheel zip (nothing is installed). Later runs read the cache. The newer wheels are built per
CPython version and platform; when the running interpreter has none, the cp311 manylinux wheel is
asked for explicitly (the Python sources inside are the same).
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

from need import missing

VERSIONS = ["0.4.6.post5", "0.4.10.post2", "0.5.1", "0.5.5", "0.5.12", "0.5.14", "0.5.23"]
REFUSED = ["0.4.6"]
MLA = "srt/layers/attention/flashinfer_mla_backend.py"
FA3 = "srt/layers/attention/flashattention_backend.py"

CACHE = Path(os.environ.get("PERFSCOPE_TEST_CACHE", Path.home() / ".cache" / "perfscope-tests")) / "sglang-wheels"


def _wheel(version: str) -> Path:
    CACHE.mkdir(parents=True, exist_ok=True)
    found = sorted(CACHE.glob(f"sglang-{version}-*.whl"))
    if found:
        return found[0]
    base = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-cache-dir", "-q", "-d", str(CACHE),
            f"sglang=={version}"]
    attempts = [base, base + ["--only-binary=:all:", "--python-version", "3.11", "--implementation", "cp",
                              "--platform", "manylinux_2_34_x86_64", "--abi", "cp311"]]
    errors = []
    for cmd in attempts:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        found = sorted(CACHE.glob(f"sglang-{version}-*.whl"))
        if found:
            return found[0]
        errors.append(r.stderr.strip().splitlines()[-1:] or [f"rc {r.returncode}"])
    msg = f"pip download sglang=={version} failed: {errors}"
    missing(msg)


def sglang_file(version: str, relpath: str) -> bytes:
    """The bytes of ``sglang/<relpath>`` in the released wheel of ``version`` (cached)."""
    out = CACHE / "extracted" / version / relpath
    if out.is_file():
        return out.read_bytes()
    with zipfile.ZipFile(_wheel(version)) as z:
        data = z.read(f"sglang/{relpath}")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_bytes(data)
    tmp.replace(out)
    return data


def sglang_tree(version: str, dest: Path) -> Path:
    """A minimal sglang package folder for ``--sglang-root``: the two attention backends and
    version.py (the real ones from the wheel)."""
    root = dest / "sglang"
    for rel in (MLA, FA3):
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(sglang_file(version, rel))
    with zipfile.ZipFile(_wheel(version)) as z:
        names = set(z.namelist())
        for rel in ("version.py", "_version.py"):
            if f"sglang/{rel}" in names:
                (root / rel).write_bytes(z.read(f"sglang/{rel}"))
    return root
