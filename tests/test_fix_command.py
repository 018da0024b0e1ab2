"""One fix command everywhere: for the same input, the terminal (80 and 200 columns, piped), the
Markdown summary, diagnose --html, perfscope report and --json print the same command, the one
that works from where the user is: aimed at the host and port the run folder recorded, reading
the run (--trace); a trace that does not say where its server runs says what to add."""

from __future__ import annotations

import html
import json
import os
import shutil
from pathlib import Path

from clirun import invoke
from paths import H200
from perfscope.rundir import write_run


def cli(*args, columns: int = 200, cwd=None):
    return invoke(*args, cwd=cwd, env={**os.environ, "COLUMNS": str(columns)})


def _run_folder(root: Path) -> Path:
    """A run folder as `perfscope trace --host gpu-box --port 30001` leaves it, around a real trace."""
    (root / "traces").mkdir(parents=True)
    dst = root / "traces" / "1730000000.0-TP-0-DECODE.trace.json.gz"
    shutil.copyfile(H200 / "mla_pool_graph.json.xz", dst)
    write_run(root, command=["perfscope", "trace"], host="gpu-box", engine="sglang",
              server_info={"kv_cache_dtype": "fp8_e4m3", "attention_backend": "flashinfer", "port": 30001},
              files=[{"path": dst.relative_to(root).as_posix()}])
    return root


def _every_renderer(tmp_path: Path, target: Path) -> dict:
    out = {}
    r = cli("diagnose", target, "--json")
    assert r.returncode == 0, r.stderr
    out["json"] = json.loads(r.stdout)["findings"][0]["fix_command"]
    for cols in (80, 200):
        r = cli("diagnose", target, "--markdown", tmp_path / f"s{cols}.md", "--html", tmp_path / f"d{cols}.html",
                columns=cols)
        assert r.returncode == 0, r.stderr
        out[f"terminal{cols}"] = r.stdout
    out["markdown"] = (tmp_path / "s200.md").read_text()
    out["html"] = (tmp_path / "d200.html").read_text()
    r = cli("report", target, "-o", tmp_path / "report.html")
    assert r.returncode == 0, r.stderr
    out["report"] = (tmp_path / "report.html").read_text()
    return out


def test_every_renderer_prints_the_recorded_host_port_and_run(tmp_path):
    run = _run_folder(tmp_path / "run1")
    out = _every_renderer(tmp_path, run)
    cmd = f"perfscope fix fp8-kv-cast --host gpu-box --port 30001 --trace {run}"
    assert out["json"] == cmd
    for cols in (80, 200):  # piped: one unfolded line, in the panel or right under it
        assert cmd in out[f"terminal{cols}"].splitlines() or f"fix:   {cmd}" in out[f"terminal{cols}"], cols
        assert "add --host HOST" not in out[f"terminal{cols}"]
    assert f"`{cmd}`" in out["markdown"]
    for page in ("html", "report"):
        assert f"<code>{html.escape(cmd)}</code>" in out[page], page


def test_a_bare_trace_says_what_to_add(tmp_path):
    trace = tmp_path / "t.json.gz"
    shutil.copyfile(H200 / "mla_pool_graph.json.xz", trace)
    out = _every_renderer(tmp_path, trace)
    cmd = f"perfscope fix fp8-kv-cast --trace {trace}"
    assert out["json"] == cmd
    hint = "add --host HOST (its SSH name"
    assert "no host recorded: add --host HOST" in out["terminal80"] and cmd in out["terminal200"]
    assert f"`{cmd}`" in out["markdown"] and hint in out["markdown"]
    for page in ("html", "report"):
        assert f"<code>{html.escape(cmd)}</code>" in out[page] and hint in out[page], page


def test_the_pages_show_the_command_in_chromium(tmp_path, chromium):
    """diagnose --html and perfscope report of the same run folder, drawn in headless Chromium: the
    verdict's fix line shows the command a user copies (the recorded --host/--port, --trace of the
    run) as the text of its code element, and every finding's fix line the same command."""
    from browser import load_page

    run = _run_folder(tmp_path / "run1")
    cmd = f"perfscope fix fp8-kv-cast --host gpu-box --port 30001 --trace {run}"
    r = cli("diagnose", run, "--html", tmp_path / "d.html")
    assert r.returncode == 0, r.stderr
    r = cli("report", run, "-o", tmp_path / "report.html")
    assert r.returncode == 0, r.stderr
    for page in ("d.html", "report.html"):
        def act(p):
            act.codes = p.evaluate("() => Array.from(document.querySelectorAll('.fixcmd code')).map(c => c.innerText)")
            act.shown = p.evaluate("() => { const c = document.querySelector('.fixcmd code');"
                                   " const r = c.getBoundingClientRect(); return r.width > 0 && r.top < 1000; }")

        res = load_page(chromium, tmp_path / page, actions=act)
        assert res.console_errors == [] and res.page_errors == []
        assert act.codes and all(c == cmd for c in act.codes), (page, act.codes)
        assert act.shown, page  # on the first screen
