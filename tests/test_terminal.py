"""`perfscope diagnose` in a terminal, as a new user first sees it, on the real traces: the verdict
first (finding, cost, fix command, prediction in the first 10 lines of an 80-column screen), then
the buckets, then the ops; evidence in words and units; no share above 100%; the floor hint only
when options would give the floor; a folder with non-trace JSON analysed, the rest skipped."""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess

import pytest

from clirun import invoke
from paths import H200, HTA, TRACELENS, gz_bytes

pytestmark = pytest.mark.shared_reads  # analyses of committed real traces share their reads (tests/realtraces.py)


def screen(*args, columns=80) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": str(columns), "TERM": "dumb"}
    env.pop("NO_COLOR", None)
    return invoke("diagnose", *args, env=env)


# The same command on the same real input (files of the repository, never changed) prints the same: the
# tests that read one such output take it from here, run once per session.
@functools.lru_cache(maxsize=None)
def screen_once(*args, columns=80):
    return screen(*args, columns=columns)


@functools.lru_cache(maxsize=None)
def piped_once(*args, columns=None):
    """``perfscope ARGS`` with ``COLUMNS`` set (piped, the environment's TERM), or as it is when None."""
    return invoke(*args, env={**os.environ, "COLUMNS": str(columns)} if columns else None)


def test_first_screen_tells_the_story():
    r = screen(H200 / "mla_pool_graph.json.xz")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    first = "\n".join(lines[:10])
    assert "fp8-kv-cast" in first and "Whole FP8 KV pool cast to BF16" in first
    assert "50.98 ms per step (88.9% of kernel time)" in first
    # the check (diff, nothing changed) reading this trace, then the same with --apply
    flat_first = " ".join(re.sub(r"[│╭╮╰╯─]", " ", first).split())
    # the command is never folded: one whole line a user can paste, inside the panel when it fits,
    # else right under it (the panel says where); CI's clone path is longer than the panel is wide
    cmd = f"perfscope fix fp8-kv-cast --trace {H200 / 'mla_pool_graph.json.xz'}"
    inside = [ln for ln in lines[:10] if cmd in ln]
    assert len(inside) == 1, first
    if len(cmd) + 11 > 80:
        assert inside[0] == cmd and "fix: the command under this box" in flat_first, first
    else:
        assert f"fix:   {cmd}" in inside[0], first
    assert "then add --apply" in flat_first
    assert "~6.42 ms per step predicted (5.90-7.73), from 57.40 ms (8.9x faster)" in first
    # then the buckets, then the ops, then the findings in full
    pos = [r.stdout.index(x) for x in ("fix fp8-kv-cast", "by bucket", "Dominant ops", "Findings")]
    assert pos == sorted(pos)
    # evidence as a person writes it
    ev = r.stdout[r.stdout.index("evidence:"):].split("╰")[0]
    ev = " ".join(re.sub(r"[│]", " ", ev).split())
    assert "1,006.7 GB/s" in ev and "855.36 MB per cast" in ev and "60 casts per step" in ev
    assert "=" not in ev  # no key=value dumps
    # the floor is missing for a reason the user can fix: said once, shortly
    assert r.stdout.count("floor (what this step should cost") == 1
    assert "--model-config CONFIG_JSON --batch N --context TOKENS" in " ".join(r.stdout.split())


def test_a_long_fix_command_is_one_line_under_the_panel_and_fits_in_it_on_a_wide_screen(tmp_path):
    deep = tmp_path / ("a-folder-name-long-enough-to-push-the-command-past-any-panel-" * 3)
    deep.mkdir()
    shutil.copy(H200 / "mla_pool_graph.json.xz", deep / "t.json.xz")
    cmd = f"perfscope fix fp8-kv-cast --trace {deep / 't.json.xz'}"
    for columns in (80, 120):
        lines = screen(deep / "t.json.xz", columns=columns).stdout.splitlines()
        assert cmd in lines, lines[:12]  # a line of its own, whole, longer than the screen
        assert lines.index(cmd) < 10  # still on the first screen, right under the verdict
        assert f"fix [fp8-kv-cast]: {cmd}" in lines  # and under the findings panel
        assert not any(ln.startswith("│") and len(ln) > columns for ln in lines)
    # wide enough: inside the panel, and not printed again under it
    lines = screen(deep / "t.json.xz", columns=len(cmd) + 20).stdout.splitlines()
    assert cmd not in lines and any(f"fix:   {cmd}" in ln for ln in lines[:10])


def test_eager_evidence_names_dtypes_and_shares_stay_within_100_percent():
    r = screen_once(H200 / "mla_pool_eager.json.xz", columns=200)
    assert r.returncode == 0, r.stderr
    assert "fp8_e4m3 -> bf16" in r.stdout and "Float8_e4m3fn" not in r.stdout
    # eager-decode's idle is a share of the step, never of kernel time (which it can exceed)
    r = screen_once(H200 / "mla_fp8_eager.json.xz", columns=200)
    assert r.returncode == 0 and "eager-decode" in r.stdout, r.stderr
    assert re.search(r"eager-decode\] .*ms/step, \d+(\.\d)?% of the step", r.stdout), r.stdout
    for path in (H200 / "mla_pool_eager.json.xz", H200 / "mla_fp8_eager.json.xz",
                 HTA / "df_index_resolver/df_index_resolver.json.xz"):
        out = screen_once(path, columns=200).stdout
        shares = [float(x) for x in re.findall(r"(\d+(?:\.\d+)?)%", out)]
        assert shares and max(shares) <= 100, (path, max(shares))


def test_no_finding_says_what_was_analysed_and_what_the_rules_cover():
    from perfscope.analysis.rules import rule_ids

    r = screen(TRACELENS / "inference/sglang_decode/sglang_Qwen3-8B_decode.json.xz", columns=100)
    assert r.returncode == 0, r.stderr
    head = "\n".join(r.stdout.splitlines()[:10])
    assert "No known bottleneck matched in the 1 decode step analysed (their GPU kernels)" in head
    assert all(rid in r.stdout for rid in rule_ids()) and "perfscope rules" in r.stdout
    # the floor cannot be had by adding options here? then no hint at all
    assert r.stdout.count("floor") <= 1


def test_folder_with_traces_and_other_json_is_analysed_and_the_rest_skipped(tmp_path):
    folder = tmp_path / "h200"
    folder.mkdir()
    shutil.copy(H200 / "mla_fp8_graph.json.xz", folder)
    shutil.copy(H200 / "measured.json", folder)  # the CUDA-event timings that sit beside the traces
    (folder / "notes.json").write_text('["not", "an", "object"]')
    r = screen(folder, columns=120)
    assert r.returncode == 0, r.stderr
    assert "skipped 2 JSON files that are not a profiler trace: measured.json, notes.json" in r.stdout
    js = invoke("diagnose", folder, "--json")
    import json

    d = json.loads(js.stdout)
    assert sorted(x["path"].rsplit("/", 1)[1] for x in d["skipped"]) == ["measured.json", "notes.json"]
    assert d["parallel"]["files"] == 1 and d["steps"]["count"] == 5
    # only non-trace JSON: refused, saying what was skipped
    only = tmp_path / "only"
    only.mkdir()
    shutil.copy(H200 / "measured.json", only)
    r = screen(only)
    assert r.returncode == 2 and "no trace files" in r.stderr and "measured.json" in r.stderr
    # a damaged trace in a folder is still an error of its own, not skipped
    (folder / "1-TP-1.trace.json.gz").write_bytes(gz_bytes(H200 / "mla_fp8_graph.json.xz")[:1000])
    r = screen(folder)
    assert r.returncode == 2 and "truncated gzip" in r.stderr


@pytest.mark.parametrize("flag", ["--help"])
def test_diagnose_help_still_renders(flag):
    assert screen(flag).returncode == 0


def test_host_bound_prediction_is_shown_with_its_range_the_measured_after_falls_in():
    # the real SGLang 0.5.13 on the H200 (examples/gpu_loop, 495k-token FP8 pool, the fix loop): fixed, the
    # batch-1 step is bound by the host. The verdict shows the point, its range (the host's unprofiled time,
    # perfscope.analysis.hosttime) and what it is made of; the TPOT `fix --apply --restart-cmd` measured on
    # the restarted server lies in the range.
    import json

    from paths import GPU_LOOP

    res = GPU_LOOP / "h200-2026-12-01-sglang" / "pool495000-restart" / "runs"
    bug = res / "495000-bug"
    d = json.loads(piped_once("diagnose", bug, "--json").stdout)
    f = d["findings"][0]
    model = f["evidence"]["prediction"]
    assert f["id"] == "fp8-kv-cast" and model["bound"] == "host"
    lo, hi = model["range_ms"]
    first = "\n".join(screen(bug, columns=100).stdout.splitlines()[:14])
    assert f"after: ~{f['predicted_step_ms_after_fix']:.2f} ms per step predicted ({lo:.2f}-{hi:.2f})" in first, first
    assert "the host's own work ~" in first and "the host bounds it" in first
    tpot = json.loads((res / "495000-fixrun" / "restart.json").read_text())["tpot_ms_after"]
    assert lo <= tpot <= hi, (lo, tpot, hi)


def test_host_bound_range_reads_the_same_in_markdown_and_html(tmp_path):
    from paths import GPU_LOOP

    bug = GPU_LOOP / "h200-2026-12-01-sglang" / "pool495000-restart" / "runs" / "495000-bug"
    r = invoke("diagnose", bug, "--json", "--markdown", tmp_path / "d.md", "--html", tmp_path / "d.html")
    assert r.returncode == 0, r.stderr
    import json

    f = json.loads(r.stdout)["findings"][0]
    lo, hi = f["evidence"]["prediction"]["range_ms"]
    pred = f"~{f['predicted_step_ms_after_fix']:.2f} ms (range {lo:.2f}-{hi:.2f})"
    md = (tmp_path / "d.md").read_text()
    assert f"Predicted step after the fix: {pred}" in md and "the host bounds it" in md
    html = (tmp_path / "d.html").read_text()
    assert (f'predicted step after fix <b class="good">{f["predicted_step_ms_after_fix"]:.2f} ms</b> '
            f'(range {lo:.2f}-{hi:.2f} ms)') in html and "the host bounds it" in html


@pytest.mark.parametrize("columns", [60, 80])
def test_verdict_title_is_never_cropped_mid_word(columns):
    """The verdict's top border holds whole parts of "perfscope diagnose · GPU · N steps · median X ms";
    what does not fit there is the panel's first line, not cut off by the border (a user on an
    80-column terminal saw "· m─╮" for a 2-trace CPU run)."""
    r = screen(H200 / "mla_fp8_eager.json.xz", columns=columns)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    top = lines[0]
    assert len(top) <= columns, top
    parts = [p.strip() for p in top.strip("╭╮─ ").split(" · ")]
    whole = ["perfscope diagnose", "NVIDIA H200", "5 decode steps", "median 29.01 ms"]
    assert parts == whole[:len(parts)], top
    shown = " · ".join(p.strip("│ ") for p in lines[:2])
    assert "median 29.01 ms" in shown, "\n".join(lines[:3])


def boxed_lines_cropped(out: str) -> list[str]:
    """Table and panel lines cut off by the screen's edge: a line that starts inside a box but has
    lost its closing border."""
    return [ln for ln in out.splitlines() if ln[:1] in "│┃┏┡└╭╰" and ln.rstrip()[-1:] not in "│┃┓┩┘╮╯"]


def test_compare_tables_fit_80_columns(tmp_path):
    """`perfscope compare` on an 80-column screen: the changed-ops table was wider than the screen
    and rich cut its last column (n/step) and the right border off every row."""
    env = {**os.environ, "COLUMNS": "80", "TERM": "dumb"}
    r = invoke("compare", H200 / "mla_pool_graph.json.xz", H200 / "mla_pages_graph.json.xz", env=env)
    assert r.returncode == 0, r.stderr
    assert "Top ops that changed" in r.stdout and "n/step" in r.stdout, r.stdout
    assert boxed_lines_cropped(r.stdout) == [], r.stdout
    assert max(map(len, r.stdout.splitlines())) <= 80


def test_a_cost_between_steps_says_why_the_step_saves_less(tmp_path):
    """host-bubble on the graph stepbench trace, in a run folder whose bench measured the profiled step
    cycle (the host as slow unprofiled): it costs ~1.3 ms per step, mostly between steps; its fix
    predicts the step itself barely shorter: the verdict says where the rest goes (the step cycle), at
    80 and 200 columns."""
    import json

    from runs import host_bubble_run

    run = host_bubble_run(tmp_path)
    f = next(x for x in json.loads(invoke("diagnose", run, "--json").stdout)["findings"]
             if x["id"] == "host-bubble")
    ev = f["evidence"]
    for cols in (80, 200):
        r = screen(run, columns=cols)
        assert r.returncode == 0, r.stderr
        flat = " ".join(re.sub(r"[│╭╮╰╯─]", " ", r.stdout).split())
        assert f"costs {f['ms_per_step']:.2f} ms per step" in flat
        assert f"~{f['predicted_step_ms_after_fix']:.2f} ms per step predicted" in flat
        assert (f"is mostly between steps ({ev['gap_between_steps_ms']:.2f} ms): it comes off the step cycle "
                f"({ev['step_cycle_ms']:.2f} ms -> ~{ev['step_cycle_ms'] - f['ms_per_step']:.2f} ms)") in flat, flat[:900]


def test_an_op_in_some_steps_only_counts_a_fraction_not_zero():
    """index_elementwise_kernel runs in 9 of 10 decode steps of this real SGLang trace: 0.9 per step
    in the n column (it was rounded to a whole number, and an op in 2 of 5 steps showed 0)."""
    from paths import GPU_LOOP
    from perfscope.report.wording import per_step_count as count

    trace = next((GPU_LOOP / "h200-2026-12-01-sglang" / "pool-default" / "runs" / "default-pages" / "traces")
                 .glob("*DECODE.trace.json.xz"))
    for cols in (80, 200):  # piped
        r = screen(trace, "--top", "40", columns=cols)
        assert r.returncode == 0, r.stderr
        ns = [ln.rstrip("│ ").split()[-1] for ln in r.stdout.splitlines() if "index_elementwise_kernel" in ln and "│" in ln]
        assert "0.9" in ns, (cols, ns)
    assert [count(x) for x in (0.2, 0.4, 0.9, 8.0, 12.4)] == ["0.2", "0.4", "0.9", "8", "12"]


def test_compare_says_why_the_measured_kernels_make_the_error_larger():
    """BEFORE's cast prediction on the H200 loop against AFTER's bench TPOT: with the kernels it assumed
    unchanged put in at their measured times the error grows: the line says why instead of leaving it
    bare."""
    from paths import GPU_LOOP

    runs = GPU_LOOP / "h200-2026-11-29" / "runs"
    flats = []
    for cols in (80, 200):  # piped
        r = piped_once("compare", runs / "bug", runs / "pages", columns=cols)
        assert r.returncode == 0, r.stderr
        assert max(map(len, r.stdout.splitlines())) <= cols
        lines = r.stdout.splitlines()
        body = [ln[2:-1].rstrip() for ln in lines[1:next(k for k, ln in enumerate(lines) if ln.startswith("╰"))]]
        noise = [k for k, b in enumerate(body) if b.startswith("noise: ")]
        assert len(noise) == 2, body
        for k in noise:  # a noise line that wraps continues under its text (issue 23 item 5)
            k += 1
            while body[k].startswith("       "):
                k += 1
            assert body[k].startswith(("noise: ", "predicted by ")), (cols, body[k])
        flats.append(" ".join(re.sub(r"[│╭╮╰╯─]", " ", r.stdout).split()))
    import json

    c = json.loads(piped_once("compare", runs / "bug", runs / "pages", "--json").stdout)
    pr = next(x for x in c["predictions"] if x["finding"] == "fp8-kv-cast")
    e, e0 = pr["error_with_measured_kernels_pct"], pr["error_pct"]
    assert abs(e) > abs(e0) and pr["measured_tpot_ms"]  # held to AFTER's bench: the error grew with the kernels
    ch = c["change"]["step"]
    lo, hi = ch["interval"]
    for flat in flats:
        assert (f"with their measured times the error is {e:+.1f}% (larger than {e0:+.1f}%: the kernels' move had offset "
                "part of the step model's own error") in flat, flat[:1500]
        # the change with its noise and its verdict (issue 23 item 1), whole at either width
        assert f"[95% CI {lo:+.1%}, {hi:+.1%}]: {ch['verdict']}" in flat, flat[:1500]


def test_floor_lines_keep_their_indent_when_they_wrap_and_names_are_cut_at_a_boundary():
    """At 80 columns, piped: the floor's op lines wrap with their indent (not back to column 0), and a
    long kernel name is cut at a word boundary with an ellipsis, never mid-word."""
    from paths import REPO

    r = screen(H200 / "mla_pool_eager.json.xz", "--model-config", REPO / "examples" / "h200_mla_repro.config.json",
               "--context", "4096")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    i = next(k for k, ln in enumerate(lines) if ln.startswith("  ops against"))
    j = next(k for k, ln in enumerate(lines) if ln.startswith("Dominant ops"))
    block = lines[i:j]
    assert len(block) > 4 and all(ln.startswith("  ") for ln in block), block
    ops = [ln for ln in block if ln.startswith("    ")]
    assert len(ops) >= 4, block  # each op line and its continuation, indented
    import json

    js = invoke("diagnose", H200 / "mla_pool_eager.json.xz", "--json", "--model-config", REPO / "examples" / "h200_mla_repro.config.json", "--context", "4096")
    names = [o.get("short") or o["name"] for o in json.loads(js.stdout)["roofline"]["ops"]]
    cut = [ln.strip().split("…")[0] for ln in ops if "…" in ln]
    assert cut, ops  # this trace's copy kernel has a long name
    for prefix in cut:
        full = next(n for n in names if n.startswith(prefix) and len(n) > len(prefix))
        assert full[len(prefix)] in "_ <:,", (prefix, full)  # the cut falls on a boundary


_SEP_AFTER, _SEP_BEFORE = "_ ,>:/])", "[(<"


def _cells(out: str) -> list[str]:
    """The first column's cell of each table row line in ``out`` (its one-space padding kept)."""
    return [ln.split("│")[1] for ln in out.splitlines() if ln.startswith("│") and ln.count("│") >= 3]


def _name_breaks(out: str, names: list[str], used: set | None = None) -> dict:
    """Where each op name of the tables' first column in ``out`` went onto a new line: the name's
    cell lines (each starting at the cell's padding) joined back, and for each break the character
    before and after it, with the cell's width. ``used`` collects the cell lines the names took."""
    cells = _cells(out)
    found = {}
    for n in names:
        for i, c in enumerate(cells):
            if i in (used or ()) or c.startswith("  ") or not c.strip() or not n.startswith(c.strip()):
                continue
            got, breaks, j = c.strip(), [], i + 1
            while len(got) < len(n) and j < len(cells) and not cells[j].startswith("  "):
                if n[len(got)] == " ":
                    got += " "
                breaks.append(len(got))
                got += cells[j].strip()
                j += 1
            if got.startswith(n):
                found[n] = [(n[b - 1], n[b], len(c) - 2) for b in breaks if b < len(n)]
                if used is not None:
                    used.update(range(i, j))
                break
    return found


def _mid_word(n: str, breaks: list) -> list:
    """Breaks inside a word (between two characters that are not separators) of a word that would
    have fit on the cell's line."""
    bad = []
    for before, after, width in breaks:
        if before in _SEP_AFTER or after in _SEP_BEFORE or after == " ":
            continue
        bad.append((before, after, width))
    words = re.split(r"[_\s,<>:/\[\]()]+", n)
    return [b for b in bad if max(map(len, words)) <= b[2]]


@pytest.mark.parametrize("columns", [80, 200])
def test_kernel_names_in_the_op_tables_wrap_at_their_separators(columns):
    """Piped, at 80 and 200 columns: the Dominant ops table of diagnose and compare's changed-ops
    table wrap a kernel name after its `_` (or before its `[`), never mid-word: at 80 columns
    `nvjet_sm90_tst_64x8_64x16_2x1_v_bz_split` / `K_NNT` and `unrolled_elemen` / `twise_kernel`
    (rich folds a word at the cell's edge). The launching op chain's continuation lines keep its indent."""
    import json

    from paths import GPU_LOOP

    trace = H200 / "mla_pool_eager.json.xz"
    r = screen_once(trace, columns=columns)
    assert r.returncode == 0, r.stderr
    ops = json.loads(piped_once("diagnose", trace, "--json").stdout)["ops"][:10]
    table = r.stdout[r.stdout.index("Dominant ops"):]
    used: set = set()
    got = _name_breaks(table, [o["short"] for o in ops], used)
    assert len(got) == len(ops), sorted(got)
    assert all(not _mid_word(n, b) for n, b in got.items()), got
    if columns == 80:
        assert any(got.values()), got  # some names did wrap here
    # each op's "launched by" line starts with two spaces, and so does every line it wraps onto
    rest = [c for k, c in enumerate(_cells(table)) if k not in used and c.strip()]
    assert rest and all(c.startswith("   ") for c in rest), rest

    runs = GPU_LOOP / "h200-2026-11-29" / "runs"
    r = piped_once("compare", runs / "bug", runs / "pages", columns=columns)
    assert r.returncode == 0, r.stderr
    c = json.loads(piped_once("compare", runs / "bug", runs / "pages", "--json").stdout)
    names = [o["short"] + {"gone": " (gone)", "new": " (new)"}.get(o["status"], "") for o in c["ops"][:10]]
    got = _name_breaks(r.stdout[r.stdout.index("Top ops that changed"):], names)
    assert len(got) == len(names), (sorted(got), names)
    assert all(not _mid_word(n, b) for n, b in got.items()), got


@pytest.mark.parametrize("columns", [80, 200])
def test_the_verdicts_indented_lines_wrap_with_their_indent(columns):
    """Piped, at 80 and 200 columns: a verdict line under `fix:` or `after:` (the fix's notes, what
    the prediction is made of) that wraps continues under its own text, not at the panel's edge
    (at 80 columns "(no host recorded: ... or run it on the server's" / "machine)" began at column 0)."""
    r = screen_once(H200 / "mla_pool_eager.json.xz", columns=columns)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    end = next(k for k, ln in enumerate(lines) if ln.startswith("╰"))
    body = [ln[2:-1].rstrip() for ln in lines[1:end]]
    starts = ("fp8-kv-cast ", "costs ", "fix:   ", "after: ", "       ", "also: ")
    assert [b for b in body if not b.startswith(starts)] == [], body
    flat = " ".join(" ".join(body).split())
    assert "(no host recorded: add --host HOST, or run it on the server's machine)" in flat
    assert "the host bounds it)" in flat
    if columns == 80:
        assert len(body) > 7  # lines did wrap, each under its indent


@pytest.mark.parametrize("columns", [80, 200])
def test_the_files_written_are_named_on_one_line_whole(tmp_path, columns):
    """Piped (a log), at 80 and 200 columns: the lines that name what diagnose --html/--markdown/--csv,
    compare --html and report -o wrote hold each path whole on one line, pasteable; at 80 columns a
    path under a deep folder was folded mid-name ("and-" / "more/report.html")."""
    deep = tmp_path / "a-rather-long-folder-name-for-the-reports" / "with-another-long-subfolder-name" / "and-more"
    deep.mkdir(parents=True)
    env = {**os.environ, "COLUMNS": str(columns), "TERM": "dumb"}

    def run(*args):
        r = invoke(*args, env=env)
        assert r.returncode == 0, r.stderr
        return r.stderr.splitlines()

    trace = H200 / "mla_pool_graph.json.xz"
    html, md, csv = deep / "report-of-the-pool.html", deep / "summary-of-the-pool.md", deep / "tables-of-the-pool"
    assert len(str(html)) > 80
    err = run("diagnose", trace, "--html", html, "--markdown", md, "--csv", csv)
    assert any(ln.startswith("report written: ") and str(html) in ln for ln in err), err
    assert f"markdown summary written: {md}" in err, err
    assert any(ln.startswith("CSV tables written: ") and str(csv / "buckets.csv") in ln and str(csv / "ops.csv") in ln
               for ln in err), err
    cmp = deep / "before-and-after-of-the-pool.html"  # what it compares is not the subject: two small traces
    err = run("compare", trace, H200 / "mla_pages_graph.json.xz", "--html", cmp)
    assert any(ln.startswith("report written: ") and str(cmp) in ln for ln in err), err
    rep = deep / "report-command-of-the-pool.html"
    err = run("report", trace, "-o", rep)
    assert any(ln.startswith("report written: ") and str(rep) in ln for ln in err), err
