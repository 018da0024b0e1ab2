"""Bring TraceLens' Hugging Face model traces into this folder with their HF token redacted.

TraceLens (AMD-AGI/TraceLens, MIT) keeps in tests/traces/h100/ real torch-profiler traces of one
forward of Hugging Face models on an H100, each with the run's environment in its `metadata`, an
`HF_TOKEN` among it. This rewrites only that token (`hf_` and its characters -> `hf_REDACTED`), byte
for byte otherwise, and gzips the result (`gzip -9 -n` equivalent).

    python tests/traces/tracelens-hf/redact.py SRC_DIR   # SRC_DIR: a TraceLens checkout's tests/traces/h100
"""

from __future__ import annotations

import gzip
import hashlib
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
FILES = ("gaunernst_bert-small-uncased__1016001.json.gz", "Falconsai_nsfw_image_detection__1016002.json.gz",
         "google_owlv2-large-patch14-ensemble__1016001.json.gz",
         "facebook_timesformer-base-finetuned-k400__1016002.json.gz")
_TOKEN = re.compile(rb"hf_[A-Za-z0-9]{20,}")


def main(src: Path) -> None:
    for name in FILES:
        raw = gzip.decompress((src / name).read_bytes())
        out, n = _TOKEN.subn(b"hf_REDACTED", raw)
        dst = HERE / name
        tmp = dst.with_suffix(".tmp")
        with open(tmp, "wb") as f, gzip.GzipFile(filename="", mode="wb", fileobj=f, compresslevel=9, mtime=0) as g:
            g.write(out)
        tmp.replace(dst)
        print(f"{name}: {n} token(s) redacted; original JSON sha256 {hashlib.sha256(raw).hexdigest()}, "
              f"kept JSON sha256 {hashlib.sha256(out).hexdigest()}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
