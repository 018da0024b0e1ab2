"""Measure a running server: `perfscope trace` and `perfscope bench` into a run folder."""

from __future__ import annotations

import shutil

from gpuloop.base import _json_or


class TraceMixin:
    def measure(self, tag: str, url: str) -> dict:
        """bench + trace + diagnose of the server now running; returns the run's record."""
        a = self.a
        run = self.runs / tag
        if run.exists():
            shutil.rmtree(run)
        rec: dict = {}
        try:
            rec["sample_ids"] = self.sample(url)
        except Exception as e:  # noqa: BLE001
            rec["sample_error"] = str(e)
        r = self.perfscope(f"trace-{tag}", "trace", "--url", url, "--steps", str(a.trace_steps), "--input-len",
                           str(a.input_len), "--output-len", str(a.trace_output_len), "--out", str(run),
                           "--timeout", "240", "--json", timeout=300)
        rec["trace"] = _json_or(r.stdout, {"rc": r.returncode, "stderr": r.stderr[-1500:]})
        r = self.perfscope(f"bench-{tag}", "bench", "--url", url, "--input-len", str(a.input_len), "--output-len",
                           str(a.bench_output_len), "--num-requests", str(a.bench_requests), "--warmup", "1",
                           "--json", *(["--out", str(run)] if run.is_dir() else []), timeout=300)
        rec["bench"] = _json_or(r.stdout, {"rc": r.returncode, "stderr": r.stderr[-1500:]})
        if not run.is_dir():
            raise RuntimeError(f"trace {tag} made no run folder: {r.stderr[-800:]}")
        rec.update(self.diagnose(tag))
        return rec
