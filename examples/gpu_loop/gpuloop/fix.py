"""The fix phases: `perfscope fix fp8-kv-cast` on throw-away copies and on the served copy."""

from __future__ import annotations

from pathlib import Path

from gpuloop.base import REPO, _json_or


class FixMixin:
    def fix_args(self, target: Path, strategy: str, state: Path, url: str | None = None) -> list[str]:
        a = ["fix", "fp8-kv-cast", "--target-file", str(target), "--strategy", strategy, "--state-dir", str(state),
             "--python", self.py, "--json"]
        if url:
            a += ["--url", url]
        else:  # no server to read them from: what the server would report
            a += ["--kv-cache-dtype", "fp8_e4m3", "--attention-backend", "flashinfer"]
        return a

    def patch(self) -> None:
        src = REPO / "examples" / "repro_server" / "mla_attention.py"
        out = {}
        for s in ("native", "pages"):
            d = self.work / "patched" / s
            d.mkdir(parents=True, exist_ok=True)
            f = d / "mla_attention.py"
            f.write_bytes(src.read_bytes())
            r = self.perfscope(f"fix-{s}-copy", *self.fix_args(f, s, self.work / "state-copies"), "--apply", timeout=120)
            out[s] = _json_or(r.stdout, {"rc": r.returncode, "stderr": r.stderr[-800:]})
            if r.returncode != 0:
                raise RuntimeError(f"fix --apply --strategy {s} on a copy failed: {r.stderr[-500:]}")
        self.summary["patch"] = {k: _brief_fix(v) for k, v in out.items()}

    def fix(self, strategy: str, url: str | None, *, revert: bool = False) -> dict:
        target = self.work / "srv" / "examples" / "repro_server" / "mla_attention.py"
        extra = ["--revert"] if revert else ["--apply"]
        r = self.perfscope(f"fix-{strategy}-{'revert' if revert else 'apply'}",
                           *self.fix_args(target, strategy, self.work / "state-loop", url), *extra, timeout=120)
        rep = _json_or(r.stdout, {"rc": r.returncode, "stderr": r.stderr[-1500:]})
        if r.returncode != 0:
            raise RuntimeError(f"fix {' '.join(extra)} --strategy {strategy} failed: rc {r.returncode} "
                               f"{r.stdout[-600:]} {r.stderr[-600:]}")
        return _brief_fix(rep)

def _brief_fix(rep) -> dict:
    if not isinstance(rep, dict):
        return {"raw": str(rep)[:500]}
    keep = ("outcome", "reason", "strategy", "strategy_reason", "variant", "target", "path", "sha256_before",
            "sha256_after", "notes", "rejected", "environment")
    return {k: rep[k] for k in keep if k in rep} or rep
