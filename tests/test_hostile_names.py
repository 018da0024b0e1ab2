"""Names a trace carries (kernels, ops, Python functions, the device, the file's own name) are data:
shown in the terminal, in ``--markdown`` and in ``--csv`` they cannot move the cursor, set the
window title, draw a link, open an HTML tag, start a Markdown heading, split a table cell or become
a spreadsheet formula. Each test runs the real CLI on a real H200 trace whose names were rewritten
the way a hostile trace (or a traced server) would write them."""

from __future__ import annotations

import csv
import json
import os

import pytest
from markdown_it import MarkdownIt

from clirun import invoke
from paths import H200, raw_json, topen

# set the window title, clear the screen, an OSC 8 hyperlink, a bidi override, a C1 CSI
TERMINAL = "\x1b]0;pwned\x07\x1b[2J\x1b]8;;https://evil.example/\x1b\\click\x1b]8;;\x1b\\\u202e\x9b31m"
# raw HTML, a newline that starts a heading, a table pipe, a backtick, a link
MARKDOWN = "<script>alert(1)</script><img src=x onerror=alert(2)>\n# fake heading | x ` [here](https://evil.example/)"


def write_json(path, d) -> None:
    """``d`` as a trace file at ``path`` (``json.dumps``: the C encoder; ``json.dump`` to a file takes
    the pure-Python one, seconds for a trace; gzip's fastest level: the tests read names, not sizes)."""
    text = json.dumps(d)
    with topen(path, "wt", compresslevel=1) if str(path).endswith(".gz") else topen(path, "wt") as f:
        f.write(text)


def hostile_trace(path, payload, device_payload=None, formula=False):
    """mla_pool_eager with ``payload`` appended to every kernel, cpu_op and Python function name
    (the start kept, so that they still classify) and to the device's name; ``formula``: every
    kernel's name starts with a spreadsheet formula too."""
    d = raw_json(H200 / "mla_pool_eager.json.xz")
    for e in d["traceEvents"]:
        if e.get("cat") in ("kernel", "cpu_op", "python_function"):
            e["name"] = ("=HYPERLINK(\"https://evil.example\")" if formula and e["cat"] == "kernel" else "") \
                + e["name"] + payload
    d["deviceProperties"][0]["name"] = "NVIDIA H200" + (device_payload if device_payload is not None else payload)
    write_json(path, d)
    return path


@pytest.fixture(scope="module")
def terminal_trace(tmp_path_factory):
    """The hostile trace with TERMINAL in every name, written once for the tests that only read it."""
    return hostile_trace(tmp_path_factory.mktemp("hostile") / "t.json.gz", TERMINAL)


def run(*args, env=None):
    return invoke(*args, env={**os.environ, "COLUMNS": "200", **(env or {})})


def no_terminal_controls(text: str) -> bool:
    return not any(c in text for c in ("\x1b", "\x07", "\x9b", "\u202e"))


def test_terminal_output_shows_control_characters_escaped(terminal_trace):
    r = run("diagnose", terminal_trace, "--top", "20")
    assert r.returncode == 0, r.stderr
    assert no_terminal_controls(r.stdout) and no_terminal_controls(r.stderr)
    # shown, not dropped: the device's name and the op names carry their escapes visibly
    assert "NVIDIA H200\\x1b]0;pwned\\x07\\x1b[2J" in r.stdout
    assert "\\x1b]8;;https://evil.example/" in r.stdout and "\\u202e\\x9b31m" in r.stdout


def test_terminal_styles_kept_but_no_control_from_the_trace(terminal_trace):
    """On a colour terminal rich's own styles stay (SGR ``ESC [ … m``); nothing else does."""
    import re

    r = run("diagnose", terminal_trace, env={"FORCE_COLOR": "1", "TERM": "xterm-256color"})
    assert r.returncode == 0, r.stderr
    assert "\x1b[" in r.stdout  # the console did style its output
    rest = re.sub(r"\x1b\[[0-9;]*m", "", r.stdout)
    assert no_terminal_controls(rest), repr(rest[rest.find("\x1b") - 40:rest.find("\x1b") + 40])


@pytest.mark.slow  # ~5 s
def test_compare_labels_from_file_names_are_escaped(tmp_path):
    a = hostile_trace(tmp_path / "before\x1b]0;x\x07.json.gz", TERMINAL)
    b = hostile_trace(tmp_path / "after\x1b[2J.json.gz", "")
    r = run("compare", a, b)
    assert r.returncode == 0, r.stderr
    assert no_terminal_controls(r.stdout) and "before\\x1b]0;x\\x07" in r.stdout and "after\\x1b[2J" in r.stdout


def test_error_line_with_a_file_name_is_escaped(tmp_path):
    r = run("diagnose", tmp_path / "gone\x1b]0;pwned\x07\x1b[2J.json")
    assert r.returncode == 2 and no_terminal_controls(r.stderr), repr(r.stderr)
    assert "gone\\x1b]0;pwned\\x07\\x1b[2J.json" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_markdown_summary_has_no_html_heading_or_split_cell_from_the_trace(tmp_path):
    t = hostile_trace(tmp_path / "t.json.gz", TERMINAL + MARKDOWN)
    md = tmp_path / "s.md"
    r = run("diagnose", t, "--markdown", md, "--json")
    assert r.returncode == 0, r.stderr
    text = md.read_text()
    assert no_terminal_controls(text)
    html = MarkdownIt("commonmark").enable("table").render(text)
    for tag in ("<script", "<img", "<a ", "<h1", "<h2"):
        assert tag not in html, tag
    assert html.count("<h3>") == 1
    # every row of the ops table keeps its six cells: no name split one
    tokens = MarkdownIt("commonmark").enable("table").parse(text)
    rows, cells = [], 0
    for tok in tokens:
        if tok.type == "tr_open":
            cells = 0
        elif tok.type in ("td_open", "th_open"):
            cells += 1
        elif tok.type == "tr_close":
            rows.append(cells)
    ops_rows = [n for n in rows if n == 6]
    assert len(ops_rows) >= 5 and all(n in (3, 6) for n in rows), rows
    # the names are there, as text
    assert "alert(1)" in html and "evil.example" in html and "&lt;script&gt;" in html


def test_csv_cells_are_never_formulas_or_controls(tmp_path):
    t = hostile_trace(tmp_path / "t.json.gz", TERMINAL, formula=True)
    folder = tmp_path / "csv"
    r = run("diagnose", t, "--csv", folder)
    assert r.returncode == 0, r.stderr
    seen_at = seen_formula = False
    for name in ("buckets.csv", "ops.csv"):
        raw = (folder / name).read_text()
        assert no_terminal_controls(raw)
        with open(folder / name, newline="") as fh:
            for row in csv.reader(fh):
                for cell in row:
                    if cell[:1] in ("=", "+", "-", "@"):
                        float(cell)  # only a number may start so
                    seen_at |= cell.startswith("'@ ")
                    seen_formula |= cell.startswith("'=HYPERLINK")
    assert seen_at and seen_formula  # perfscope's own "@ file:line" cells and the trace's formula, quoted


# ---- HTML: Plotly's labels and hover text ------------------------------------------------------ #

PLOTLY = '<a href="https://evil.example/">click</a><b style="font-size:90px">big</b><br>'

# in the page: every link, bold or sized text in the charts' SVG, and the text of their labels
_CHART_MARKUP = """() => Array.from(document.querySelectorAll('[data-chart] svg')).map(svg => ({
    links: svg.querySelectorAll('a').length,
    styled: Array.from(svg.querySelectorAll('tspan[style]')).map(t => t.getAttribute('style'))
        .filter(s => /bold|font-size|italic/.test(s)).length,
    text: svg.textContent}))"""


def sglang_step_trace(path):
    """mla_pool_graph with its ProfilerStep ranges renamed as SGLang step annotations that carry
    Plotly markup (the step's label becomes a category of the buckets chart and its hover text),
    and the same markup in every kernel's name."""
    d = raw_json(H200 / "mla_pool_graph.json.xz")
    i = 0
    for e in d["traceEvents"]:
        if e.get("cat") == "user_annotation" and str(e.get("name", "")).startswith("ProfilerStep#"):
            e["name"] = f"step[DECODE bs=1 n={i} {PLOTLY}]{PLOTLY}"
            i += 1
        elif e.get("cat") == "kernel":
            e["name"] += PLOTLY
    write_json(path, d)
    return path


def _hover_all(page):
    """Hover every trace's first point of the buckets chart (Plotly.Fx.hover; its hover names the
    step), return the hover layer's links, styled spans and text."""
    return page.evaluate("""() => {
        const el = document.querySelector('[data-chart="buckets"]');
        const out = [];
        el.data.forEach((t, i) => {
            Plotly.Fx.hover(el, [{curveNumber: i, pointNumber: 0}]);
            const h = el.querySelector('.hoverlayer');
            out.push({links: h.querySelectorAll('a').length,
                      styled: Array.from(h.querySelectorAll('tspan[style]')).map(x => x.getAttribute('style'))
                          .filter(s => /bold|font-size/.test(s)).length, text: h.textContent});
        });
        return out;
    }""")


def test_html_report_charts_show_trace_markup_as_text(tmp_path, chromium):
    from browser import load_page

    t = sglang_step_trace(tmp_path / "t.json.gz")
    html = tmp_path / "r.html"
    r = run("diagnose", t, "--html", html)
    assert r.returncode == 0, r.stderr
    got = {}
    res = load_page(chromium, html, actions=lambda page: got.update(charts=page.evaluate(_CHART_MARKUP),
                                                                      hover=_hover_all(page)))
    assert not res.page_errors and not res.blocked
    charts = got["charts"]
    assert charts and all(c["links"] == 0 and c["styled"] == 0 for c in charts), charts
    assert any('<a href="https://evil.example/">click</a>' in c["text"] for c in charts)  # the step label, as text
    hover = [h for h in got["hover"] if "evil.example" in h["text"]]
    assert hover and all(h["links"] == 0 and h["styled"] == 0 for h in hover), got["hover"]


def test_html_compare_labels_from_file_names_show_as_text(tmp_path, chromium):
    from browser import load_page

    name = "<a href='https:evil.example'>click<b>big"  # a file name holds no "/"
    a = hostile_trace(tmp_path / f"before{name}.json.gz", "")
    b = hostile_trace(tmp_path / f"after{name}.json.gz", "")
    html = tmp_path / "c.html"
    r = run("compare", a, b, "--html", html)
    assert r.returncode == 0, r.stderr
    got = {}
    res = load_page(chromium, html, actions=lambda page: got.update(charts=page.evaluate(_CHART_MARKUP)))
    assert not res.page_errors and not res.blocked
    charts = got["charts"]
    assert charts and all(c["links"] == 0 and c["styled"] == 0 for c in charts), charts
    assert any("<a href='https:evil.example'>click<b>big" in c["text"] for c in charts)


def test_a_servers_error_body_reaches_the_terminal_escaped(tmp_path):
    """A real HTTP server on loopback answers every request with HTTP 500 and a body that would
    set the window title and clear the screen: perfscope's one error line shows it escaped."""
    body = (TERMINAL + "all findings cleared").encode()
    r = _trace_against(tmp_path, lambda path: (500, "text/plain", body))
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "all findings cleared" in r.stderr and no_terminal_controls(r.stdout + r.stderr), repr(r.stderr)
    assert "\\x1b]0;pwned\\x07" in r.stderr


def test_a_servers_configuration_strings_reach_the_log_escaped(tmp_path):
    """/server_info's version and model path go to trace's progress lines (printed as they are,
    not as markup): the console itself escapes them."""
    info = json.dumps({"version": "0.5.23" + TERMINAL, "model_path": "/m" + TERMINAL, "tp_size": 1}).encode()
    r = _trace_against(tmp_path, lambda path: (200, "application/json", info) if path.startswith("/server_info")
                       or path.startswith("/get_server_info") else (500, "text/plain", b"no"))
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "0.5.23\\x1b]0;pwned\\x07" in r.stderr and no_terminal_controls(r.stdout + r.stderr), repr(r.stderr)


def _trace_against(tmp_path, answer):
    """``perfscope trace --url`` against a real HTTP server on loopback whose every reply is
    ``answer(path) -> (status, content type, body)``."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Hostile(BaseHTTPRequestHandler):
        def _answer(self):
            status, ctype, body = answer(self.path)
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _answer

        def log_message(self, *a):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Hostile)
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        r = run("trace", "--url", f"http://127.0.0.1:{srv.server_address[1]}", "--out", tmp_path / "run",
                "--timeout", "20")
    finally:
        srv.shutdown()
        srv.server_close()
    return r


def test_fix_diff_of_a_launch_file_shows_its_control_characters_escaped(tmp_path):
    """The host's file is data too: a launch script whose comments carry escape sequences shows
    them escaped in the check's diff (tabs and newlines kept: the diff still reads as one)."""
    launch = tmp_path / "run.sh"
    launch.write_text("#!/bin/sh\n# start\x1b]0;pwned\x07\n\texec python3 -m sglang.launch_server --model-path /m "
                      "--sampling-backend pytorch \\\n  --port 30000  # \x1b[2J\n")
    r = run("fix", "torch-sampling", "--launch-file", launch, "--state-dir", tmp_path / "state")
    assert r.returncode == 0, r.stderr
    assert no_terminal_controls(r.stdout + r.stderr), repr(r.stdout)
    assert "+\texec python3 -m sglang.launch_server --model-path /m --sampling-backend flashinfer" in r.stdout
    assert " # start\\x1b]0;pwned\\x07\n" in r.stdout and "# \\x1b[2J\n" in r.stdout
