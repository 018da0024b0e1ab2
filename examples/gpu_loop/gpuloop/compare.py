"""`perfscope compare` bug vs each fix, and re-analysing brought-back run folders."""

from __future__ import annotations

import json

from gpuloop.base import _json_or


class CompareMixin:
    def compare(self) -> None:
        L = self.summary.setdefault("loop", {})
        for s in self.a.strategies:
            if (self.runs / s).is_dir() and (self.runs / "bug").is_dir():
                r = self.perfscope(f"compare-{s}", "compare", str(self.runs / "bug"), str(self.runs / s), "--html",
                                   str(self.work / f"compare-{s}.html"), "--json", timeout=240)
                L.setdefault("compare", {})[s] = _brief_compare(_json_or(r.stdout, {"rc": r.returncode,
                                                                                    "stderr": r.stderr[-800:]}))

    def analyse(self) -> None:
        """Diagnose and compare run folders already in --work again (no GPU needed), e.g. after
        unpacking a device run's traces.tar there: `--phases analyse --from-summary summary.json`."""
        runs = self.summary.setdefault("loop", {}).setdefault("runs", {})
        for tag in ["bug", *self.a.strategies]:
            if (self.runs / tag).is_dir():
                rec = runs.setdefault(tag, {})
                rec.pop("diagnose_error", None)
                rec.update(self.diagnose(tag))
        self.compare()

def _brief_compare(c) -> dict:
    if not isinstance(c, dict):
        return {"raw": str(c)[:500]}
    out = {}
    for k, v in c.items():
        s = json.dumps(v, default=str)
        out[k] = v if len(s) < 4000 else s[:4000]
    return out
