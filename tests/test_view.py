"""Every renderer draws the same verdict: for the same real input (a run folder of the H200 loop, a
trace of the kernel-mix corpus), the terminal (80 and 240 columns, piped), the Markdown summary,
diagnose --html, perfscope report and --json show the same fix command and the same predicted step
after it, with its range (--json writes each finding from the view the others draw)."""

from __future__ import annotations

import html
import json
import os
import re

import pytest

from clirun import invoke
from paths import GPU_LOOP, KERNEL_MIX
from perfscope.report.wording import ms

pytestmark = pytest.mark.shared_reads  # analyses of committed real traces share their reads (tests/realtraces.py)

INPUTS = {
    "run-folder": GPU_LOOP / "h200-2026-11-29" / "runs" / "bug",  # fp8-kv-cast, its bench's host timing
    "trace": KERNEL_MIX / "sample_topk.json.gz",  # torch-sampling, a bare trace: no host recorded
}


def cli(*args, columns: int = 240) -> str:
    """``perfscope ARGS``, piped, ``COLUMNS`` wide (in this process: what is drawn is the subject here)."""
    r = invoke(*args, env={**os.environ, "COLUMNS": str(columns)})
    assert r.returncode == 0, r.stderr
    return r.stdout


def flat(text: str) -> str:
    """A terminal's text with the panels' borders gone and every run of blanks one space: a line
    wrapped at 80 columns reads as the one line it is at 240."""
    return re.sub(r"\s+", " ", re.sub(r"[│╭╮╰╯─]", " ", text))


@pytest.mark.parametrize("name", sorted(INPUTS))
def test_every_renderer_shows_the_same_fix_command_and_predicted_step(tmp_path, name):
    target = INPUTS[name]
    d = json.loads(cli("diagnose", target, "--json", "--markdown", tmp_path / "s.md", "--html", tmp_path / "d.html"))
    f = d["findings"][0]
    cmd = f["fix_command"]
    assert cmd == f"perfscope fix {f['fix']} --trace {target}"  # no host recorded: the one input it read
    pred = f["predicted_step_ms_after_fix"]
    lo, hi = f["predicted_range_ms"]  # --json writes the view's prediction, as the others draw it
    assert [lo, hi] == f["evidence"]["prediction"]["range_ms"] and lo < pred < hi
    after = f"~{ms(pred)} ms per step predicted ({ms(lo)}-{ms(hi)})"

    for cols in (80, 240):
        out = cli("diagnose", target, columns=cols)
        # the command on one line of its own or whole in the verdict panel: it pastes as it is
        assert cmd in out.splitlines() or f"fix:   {cmd}" in out, cols
        assert f"after: {after}" in flat(out), cols
        assert f"predicted step after fix: {ms(pred)} ms" in flat(out), cols

    md = (tmp_path / "s.md").read_text()
    assert f"Fix: `{cmd}` (check + diff), then `{cmd} --apply`." in md
    assert f"Predicted step after the fix: ~{ms(pred)} ms (range {ms(lo)}-{ms(hi)})" in md

    cli("report", target, "-o", tmp_path / "r.html")
    for page in ("d.html", "r.html"):
        text = (tmp_path / page).read_text()
        codes = re.findall(r'class="fixcmd">fix: <code>([^<]*)</code>', text)
        assert codes and all(html.unescape(c) == cmd for c in codes), (page, codes)
        assert f'predicted step after fix <b class="good">{ms(pred)} ms</b> (range {ms(lo)}-{ms(hi)} ms)' in text, page


@pytest.mark.parametrize("name", sorted(INPUTS))
def test_json_findings_are_the_view_of_each_finding(name):
    """Every finding of --json, not only the verdict: its command and predicted step and range are
    the view's (a point prediction's range is [step, step]); the analysis' own findings are unchanged."""
    from perfscope.cli._diagnosis import build_diagnosis
    from perfscope.report.view import diagnosis_json, view

    target = INPUTS[name]
    js = json.loads(cli("diagnose", target, "--json"))
    d = build_diagnosis([target])
    views = view(d).findings
    assert [f["id"] for f in js["findings"]] == [fv.finding.id for fv in views] and views
    for f, fv in zip(js["findings"], views):
        assert f["fix_command"] == (fv.fix.check if fv.fix else None)
        pr = fv.prediction
        assert f["predicted_range_ms"] == ([pr.low, pr.high] if pr else None)
        if pr is not None:
            assert f["predicted_step_ms_after_fix"] == pr.step_ms and pr.low <= pr.step_ms <= pr.high
    # the rest of the document is the diagnosis' JSON
    assert json.loads(json.dumps(diagnosis_json(d), default=str)) == js
    assert {k: v for k, v in js.items() if k != "findings"} == json.loads(json.dumps(
        {k: v for k, v in d.to_dict().items() if k != "findings"}, default=str))
