"""Setup phases: the environment record and FlashInfer's JIT cache carried between runs."""

from __future__ import annotations

import json
import os
import sys
import tarfile
import time
from pathlib import Path

from gpuloop.base import MAX_OUT_FILE, REPO


class InstallMixin:
    def env(self) -> None:
        info: dict = {"python": sys.version.split()[0], "host": os.uname().nodename}
        r = self.sh("nvidia-smi", ["nvidia-smi", "--query-gpu=name,driver_version,compute_cap,memory.total,clocks.max.sm",
                                   "--format=csv,noheader"], timeout=30)
        info["nvidia_smi"] = r.stdout.strip()
        code = ("import json,torch\nd={'torch':torch.__version__,'cuda':torch.version.cuda,"
                "'gpu':torch.cuda.get_device_name() if torch.cuda.is_available() else None}\n"
                "for m in ('flashinfer','triton','msgspec','orjson','plotly','paramiko'):\n"
                "  try:\n    mod=__import__(m); d[m]=getattr(mod,'__version__','?')\n"
                "  except Exception as e: d[m]='missing: %s'%e\nprint(json.dumps(d))")
        r = self.sh("versions", [self.py, "-c", code], timeout=120)
        try:
            info.update(json.loads(r.stdout.strip().splitlines()[-1]))
        except (ValueError, IndexError):
            info["versions_error"] = r.stderr[-500:]
        # is FlashInfer's MLA importable without the cuDNN frontend wheel? (then later runs carry less)
        r = self.sh("flashinfer-without-cudnn", [self.py, "-c", "import sys; sys.modules['cudnn'] = None; "
                                                 "import flashinfer.mla; print('ok')"], timeout=120)
        info["flashinfer_mla_imports_without_cudnn"] = r.returncode == 0 and "ok" in r.stdout
        self.summary["env"] = info

    def jit_dir(self) -> Path:
        return Path(os.environ["FLASHINFER_WORKSPACE_BASE"]) / ".cache" / "flashinfer"

    def restore_jit_cache(self) -> None:
        """Unpack a cache an earlier run brought back, then mark every file newer than the freshly
        installed FlashInfer sources so that ninja finds the kernels up to date."""
        src = REPO / ".gpuloop-carry" / "fi-jit-cache.tar.gz"
        if not src.is_file():
            self.summary["jit_cache"] = "none carried"
            return
        d = self.jit_dir()
        d.mkdir(parents=True, exist_ok=True)
        with tarfile.open(src) as tf:
            tf.extractall(d, filter="data")
        t = time.time() + 1
        n = 0
        for f in d.rglob("*"):
            os.utime(f, (t, t), follow_symlinks=False)
            n += 1
        self.summary["jit_cache"] = f"restored {n} entries from {src.name}"
        self.jit_restored = True

    def pack_jit_cache(self) -> None:
        d = self.jit_dir()
        if getattr(self, "jit_restored", False) or not d.is_dir():
            return
        dst = self.out / "fi-jit-cache.tar.gz"
        with tarfile.open(dst, "w:gz") as tf:
            for f in sorted(d.rglob("*")):
                if f.is_file() and "cubins" not in f.parts:
                    tf.add(f, arcname=str(f.relative_to(d)))
        size = dst.stat().st_size
        self.summary["jit_cache_packed_bytes"] = size
        if size > MAX_OUT_FILE:
            dst.unlink()
            self.summary["jit_cache_packed_bytes"] = f"{size} (too big, not brought back)"
