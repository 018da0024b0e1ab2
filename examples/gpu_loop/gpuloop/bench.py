"""In-process step benchmark (examples/repro_server/stepbench.py) and the model sizes."""

from __future__ import annotations

import json


class BenchMixin:
    def stepbench(self) -> None:
        a = self.a
        argv = [self.py, "-m", "examples.repro_server.stepbench", "--device", a.device, "--batch", "1",
                "--context", str(a.context), "--steps", str(a.steps), "--warmup", "3",
                "--strategies", "pool,pages,fp8", "--out", str(self.work / "stepbench.json"), "--json"]
        if self.cuda:
            argv += ["--modes", "eager,graph", "--flashinfer-backend", a.flashinfer_backend]
        for s in ("native", "pages"):
            f = self.work / "patched" / s / "mla_attention.py"
            if f.is_file():
                argv += ["--source", f"fix-{s}={f}"]
        argv += self.size_args()
        self.sh("stepbench", argv, timeout=a.stepbench_timeout)
        p = self.work / "stepbench.json"
        if not p.is_file():
            raise RuntimeError("stepbench wrote no result (see logs/stepbench.err)")
        self.summary["stepbench"] = json.loads(p.read_text())

    def size_args(self) -> list[str]:
        a = self.a
        if a.small:
            return ["--num-layers", "4", "--hidden-size", "256", "--num-heads", "4", "--max-total-tokens", "32768",
                    "--vocab-size", "1024"]
        return ["--num-layers", "60", "--hidden-size", "7168", "--num-heads", "16", "--max-total-tokens",
                str(a.pool_tokens), "--vocab-size", "32000"]
