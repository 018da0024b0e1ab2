"""`diagnose --markdown FILE`: the summary a user pastes into an issue or PR (verdict, bucket table,
top ops, findings), and `--csv DIR`: the bucket and op tables (and the per-rank table) as CSV.
Every string from the trace passes :mod:`perfscope.report.escape` (Markdown text, code spans,
CSV cells)."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

from perfscope import __version__
from perfscope.analysis.gpus import device_label
from perfscope.analysis.result import Diagnosis
from perfscope.report import wording
from perfscope.report.escape import csv_row, md_code as _code, md_text as _text
from perfscope.report.terminal import share_of
from perfscope.report.terminal_tables import op_where
from perfscope.report.view import view
from perfscope.util.files import atomic_write_text


def diagnosis_markdown(d: Diagnosis, top: int = 10) -> str:
    p = d.primary
    s = p.steps
    cpu = s.cpu_only
    gpu = device_label(p.meta) or ("CPU (no GPU activity)" if cpu else "unknown GPU")
    n = s.count
    out = [
        f"### perfscope diagnose: {_text(gpu)}, {n} {_text(s.phase)} step{'s' if n != 1 else ''}, "
        f"median {wording.ms(s.median_ms)} ms",
        "",
    ]
    verdict = view(d).top
    if verdict is not None:
        f = verdict.finding
        line = (
            f"**Verdict: {_code(f.id)} {_text(f.title)}**: {wording.ms(f.ms_per_step)} ms per step "
            f"({wording.pct(f.share)} of {share_of(f, cpu)}), confidence {f.confidence}."
        )
        fc = verdict.fix
        if fc is not None:
            line += f" Fix: {_code(fc.check)} (check + diff), then {_code(fc.apply)}."
            if fc.where:
                line += f" ({fc.where[0].upper() + fc.where[1:]}.)"
        elif f.remedy:
            line += f" Remedy: {_text(f.remedy)}"
        pr = verdict.prediction
        if pr is not None and pr.speedup:
            line += (
                f" Predicted step after the fix: ~{wording.ms(pr.step_ms)} ms"
                + (f" (range {wording.ms_range((pr.low, pr.high))})" if pr.ranged else "")
                + f", {pr.speedup:.1f}x faster"
                + (f"; {pr.basis}" if pr.basis else "")
                + "."
            )
            if pr.saving:
                line += f" ({_text(pr.saving[0].upper() + pr.saving[1:])}.)"
        out += [line, ""]
    else:
        out += [
            f"**No known bottleneck matched** in the {n} {s.phase} steps analysed "
            f"({'CPU ops' if cpu else 'GPU kernels'}).",
            "",
        ]
    skipped = wording.skipped_note(d.skipped)
    if skipped:
        out += [f"Note: {_text(skipped)}.", ""]
    t = d.timings
    if t.get("tpot_ms"):
        how = "perfscope bench" if t["source"] == "bench" else "during the trace, under the profiler"
        out += [f"Measured TPOT ({how}): {wording.ms(t['tpot_ms'])} ms.", ""]
    what = "CPU op" if cpu else "GPU kernel"
    out += [f"| bucket | {what} ms/step | share |", "|---|---:|---:|"]
    for b, v in sorted(p.buckets.items(), key=lambda kv: -kv[1]["ms_per_step"]):
        if v["ms_per_step"] > 0:
            out.append(f"| {_text(b)} | {wording.ms(v['ms_per_step'])} | {wording.pct(v['share'])} |")
    if p.idle_ms_per_step:
        out.append(f"| ({'idle' if cpu else 'GPU idle'} in step) | {wording.ms(p.idle_ms_per_step)} | |")
    out += [
        "",
        "**Top ops** (per step)",
        "",
        "| op | bucket | ms | share | n | launched by |",
        "|---|---|---:|---:|---:|---|",
    ]
    for o in p.ops[:top]:
        out.append(
            f"| {_code(o.short, in_table=True)} | {_text(o.bucket)} | {wording.ms(o.ms_per_step)} | {wording.pct(o.share)} | "
            f"{wording.per_step_count(o.count_per_step)} | {_code(op_where(o, wording.graph_word(p.meta)), in_table=True)} |"
        )
    if p.findings:
        out += ["", "**Findings**", ""]
        for fv in view(d).findings:
            f, pr = fv.finding, fv.prediction
            ev = wording.evidence_items({k: v for k, v in (f.evidence or {}).items() if k != "floor_step_ms"})
            out.append(
                f"- {_code(f.id)} {_text(f.title)}: {wording.ms(f.ms_per_step)} ms/step, "
                f"{wording.pct(f.share)} of {share_of(f, cpu)}, confidence {f.confidence}"
                + (f"; predicted step after fix {wording.ms_range((pr.low, pr.high))} ms" if pr else "")
                + ".  "
            )
            out.append(f"  {_text(f.summary)}" + (f"  \n  Evidence: {'; '.join(_text(e) for e in ev)}." if ev else ""))
    if len(d.ranks) > 1:
        out += ["", "| rank | stage | steps | median ms |", "|---:|---|---:|---:|"]
        for r in d.ranks:
            out.append(
                f"| {r.rank if r.rank is not None else '-'} | {_text(r.stage or '')} | {r.steps.count} | "
                f"{wording.ms(r.steps.median_ms)} |"
            )
    out += [
        "",
        f"<sub>perfscope {__version__}; {len(d.ranks)} trace file(s); steps found by {_text(s.how or s.method)}</sub>",
        "",
    ]
    return "\n".join(out)


def _csv(rows: list[list]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerows(csv_row(r) for r in rows)
    return buf.getvalue()


def write_csv(folder: Path, d: Diagnosis) -> list[Path]:
    """buckets.csv, ops.csv and (several ranks) ranks.csv in ``folder``: plain numbers (ms, shares
    as fractions), one header row each; written atomically."""
    p = d.primary
    folder.mkdir(parents=True, exist_ok=True)
    rows: list[list[Any]] = [["bucket", "ms_per_step", "share"]]
    for b, v in sorted(p.buckets.items(), key=lambda kv: -kv[1]["ms_per_step"]):
        rows.append([b, round(v["ms_per_step"], 6), round(v["share"], 6)])
    rows.append(["(idle in step)", round(p.idle_ms_per_step or 0.0, 6), ""])
    written = [atomic_write_text(folder / "buckets.csv", _csv(rows), shared=True)]
    rows = [["rank", "op", "bucket", "sub", "ms_per_step", "share", "count_per_step", "launched_by", "name"]]
    for r in d.ranks:
        for o in r.ops:
            rows.append(
                [
                    r.rank if r.rank is not None else "",
                    o.short,
                    o.bucket,
                    o.sub or "",
                    round(o.ms_per_step, 6),
                    round(o.share, 6),
                    round(o.count_per_step, 3),
                    op_where(o, wording.graph_word(r.meta)),
                    o.name,
                ]
            )
    written.append(atomic_write_text(folder / "ops.csv", _csv(rows), shared=True))
    if len(d.ranks) > 1:
        buckets = sorted({b for r in d.ranks for b in r.buckets})
        rows = [["rank", "stage", "steps", "median_ms", "idle_ms_per_step", *[f"{b}_ms_per_step" for b in buckets]]]
        for r in d.ranks:
            rows.append(
                [
                    r.rank if r.rank is not None else "",
                    r.stage or "",
                    r.steps.count,
                    r.steps.median_ms,
                    r.idle_ms_per_step,
                    *[round((r.buckets.get(b) or {}).get("ms_per_step", 0.0), 6) for b in buckets],
                ]
            )
        written.append(atomic_write_text(folder / "ranks.csv", _csv(rows), shared=True))
    return written
