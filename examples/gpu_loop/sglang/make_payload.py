"""Build the archive ``run_loop.py --engine sglang --payload`` installs on the H200 (a CPU machine
with PyPI and Debian; nothing of it runs the wheels).

    python3 examples/gpu_loop/sglang/make_payload.py DIR      # writes DIR/site.tar.xz (~46 MB)

Downloads (pip, cp312 manylinux, no dependencies resolved: the set is pinned) the SGLang 0.5.13.post1
set of ../shared/tools/real-sglang-h200/MANIFEST.tsv (SGLang, FlashInfer 0.6.12, sglang-kernel
0.4.3, transformers 5.8.1, tokenizers 0.22.2 and ~34 small wheels the H200 image lacks) plus
paramiko and its needs (perfscope imports it), unpacks them into one site-packages tree without
sglang-kernel's FA3 module (1 GB), its SM100 build and the mscclpp libraries (not used on one
H200), adds Debian's libnuma.so.1 (``_h15lib/``, used only where the machine lacks it), and packs
the tree as tar.xz: the wheels are 71.5 MB, the archive fits one device call (64 MiB)."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

SET = """apache_tvm_ffi==0.1.9 flashinfer_python==0.6.12 sglang_kernel==0.4.3 tokenizers==0.22.2
transformers==5.8.1 annotated_types==0.8.0 cffi==2.1.1 compressed_tensors==0.20.1 dill==0.4.1 distro==1.9.0
fastapi==0.165.0 gguf==0.19.0 ipython==9.18.1 jiter==0.19.0 jsonschema==4.26.0
jsonschema_specifications==2025.9.1 loguru==0.7.3 msgspec==0.23.0 openai==2.6.1 opentelemetry_api==1.45.2
orjson==3.13.0 partial_json_parser==0.2.1.1.post7 pybase64==1.5.1 pycparser==3.12 pydantic==2.14.4
pydantic_core==2.50.5 python_multipart==0.0.34 pyzmq==27.3.0 referencing==0.37.0 rpds_py==2026.9.1
setproctitle==1.3.8 sglang==0.5.13.post1 sniffio==1.3.1 soundfile==0.13.1 starlette==1.10.0 traitlets==5.16.1
typing_extensions==4.16.0 typing_inspection==0.4.5 uvicorn==0.54.0
paramiko==5.1.0 bcrypt==5.0.0 cryptography==50.0.2 pynacl==1.6.2 invoke==3.0.3""".split()
PLATFORMS = ["manylinux_2_34_x86_64", "manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_26_x86_64",
             "manylinux_2_24_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux_2_5_x86_64",
             "manylinux1_x86_64"]
# only from the sglang-kernel wheel (sglang's own pymscclpp.py must stay: parallel_state imports it)
DROP = ("sgl_kernel/flash_ops", "sgl_kernel/sm100/", "mscclpp")


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "payload")
    whl, site = out / "wheels", out / "site"
    whl.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
           "3.12", "--implementation", "cp", "-d", str(whl)]
    for p in PLATFORMS:
        cmd += ["--platform", p]
    subprocess.run(cmd + SET, check=True)
    for w in sorted(whl.glob("*.whl")):
        z = zipfile.ZipFile(w)
        kernel = w.name.startswith("sglang_kernel-")
        for i in z.infolist():
            n = i.filename
            if n.endswith("/") or (kernel and any(n.startswith(d) or d in n for d in DROP)):
                continue
            top, _, rest = n.partition("/")
            if top.endswith(".data"):
                kind, _, rest = rest.partition("/")
                if kind not in ("purelib", "platlib"):
                    continue  # scripts, man pages
                n = rest
            p = site / n
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(z.read(i))
            if (i.external_attr >> 16) & 0o111:
                os.chmod(p, 0o755)
    deb = out / "deb"
    deb.mkdir(exist_ok=True)
    subprocess.run(["apt-get", "download", "libnuma1"], cwd=deb, check=True)
    x = out / "numa"
    subprocess.run(["dpkg", "-x", str(next(deb.glob("libnuma1_*.deb"))), str(x)], check=True)
    (site / "_h15lib").mkdir(exist_ok=True)
    (site / "_h15lib" / "libnuma.so.1").write_bytes(next(x.rglob("libnuma.so.1")).read_bytes())
    with tarfile.open(out / "site.tar.xz", "w:xz", preset=6) as tf:
        for p in sorted(site.iterdir()):
            tf.add(p, arcname=p.name)
    print(out / "site.tar.xz", (out / "site.tar.xz").stat().st_size)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
