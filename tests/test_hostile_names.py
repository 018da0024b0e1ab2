"""Names a trace carries (kernels, ops, Python functions, the device, the file's own name) are data:
shown in the terminal, in ``--markdown`` and in ``--csv`` they cannot move the cursor, set the
window title, draw a link, open an HTML tag, start a Markdown heading, split a table cell or become
a spreadsheet formula. Each test runs the real CLI on a real H200 trace whose names were rewritten
the way a hostile trace (or a traced server) would write them."""

from __future__ import annotations

import csv
import gzip
import json
import os
import subprocess
import sys

import pytest
from markdown_it import MarkdownIt

from paths import H200

# set the window title, clear the screen, an OSC 8 hyperlink, a bidi override, a C1 CSI
TERMINAL = "\x1b]0;pwned\x07\x1b[2J\x1b]8;;https://evil.example/\x1b\\click\x1b]8;;\x1b\\\u202e\x9b31m"
# raw HTML, a newline that starts a heading, a table pipe, a backtick, a link
MARKDOWN = "<script>alert(1)</script><img src=x onerror=alert(2)>\n# fake heading | x ` [here](https://evil.example/)"


def hostile_trace(path, payload, device_payload=None, formula=False):
    """mla_pool_eager with ``payload`` appended to every kernel, cpu_op and Python function name
    (the start kept, so that they still classify) and to the device's name; ``formula``: every
    kernel's name starts with a spreadsheet formula too."""
    d = json.load(gzip.open(H200 / "mla_pool_eager.json.gz"))
    for e in d["traceEvents"]:
        if e.get("cat") in ("kernel", "cpu_op", "python_function"):
            e["name"] = ("=HYPERLINK(\"https://evil.example\")" if formula and e["cat"] == "kernel" else "") \
                + e["name"] + payload
    d["deviceProperties"][0]["name"] = "NVIDIA H200" + (device_payload if device_payload is not None else payload)
    with gzip.open(path, "wt") as f:
        json.dump(d, f)
    return path


def run(*args, env=None):
    return subprocess.run([sys.executable, "-m", "perfscope", *map(str, args)], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "COLUMNS": "200", **(env or {})})


def no_terminal_controls(text: str) -> bool:
    return not any(c in text for c in ("\x1b", "\x07", "\x9b", "\u202e"))


def test_terminal_output_shows_control_characters_escaped(tmp_path):
    t = hostile_trace(tmp_path / "t.json.gz", TERMINAL)
    r = run("diagnose", t, "--top", "20")
    assert r.returncode == 0, r.stderr
    assert no_terminal_controls(r.stdout) and no_terminal_controls(r.stderr)
    # shown, not dropped: the device's name and the op names carry their escapes visibly
    assert "NVIDIA H200\\x1b]0;pwned\\x07\\x1b[2J" in r.stdout
    assert "\\x1b]8;;https://evil.example/" in r.stdout and "\\u202e\\x9b31m" in r.stdout


def test_terminal_styles_kept_but_no_control_from_the_trace(tmp_path):
    """On a colour terminal rich's own styles stay (SGR ``ESC [ … m``); nothing else does."""
    import re

    t = hostile_trace(tmp_path / "t.json.gz", TERMINAL)
    r = run("diagnose", t, env={"FORCE_COLOR": "1", "TERM": "xterm-256color"})
    assert r.returncode == 0, r.stderr
    assert "\x1b[" in r.stdout  # the console did style its output
    rest = re.sub(r"\x1b\[[0-9;]*m", "", r.stdout)
    assert no_terminal_controls(rest), repr(rest[rest.find("\x1b") - 40:rest.find("\x1b") + 40])


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
