"""HTML reports: self-contained pages rendered from a Diagnosis / a comparison, checked as files and in
a real headless Chromium (Debian's, via playwright-python) with the network cut off. Screenshots of
every report kind land in tests/_output/ for a reviewer."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from clirun import invoke
from browser import load_page, png_colours  # the chromium and open_page fixtures: tests/conftest.py
from perfscope.analysis.compare import compare
from perfscope.analysis.diagnose import diagnose
from perfscope.errors import InputError
from perfscope.report.html import idle_gaps, render_compare, render_diagnosis, timeline_data, write_html
from perfscope.rundir import write_run

from paths import TRACES  # noqa: E402
from realtraces import real_diagnosis  # noqa: E402

pytestmark = pytest.mark.shared_reads  # analyses of committed real traces share their reads (tests/realtraces.py)
H200 = TRACES / "h200-mla-fp8-kv"
PUBLIC = TRACES / "public"
QWEN = PUBLIC / "TraceLens" / "tests" / "traces"
BLOB = re.compile(r'<script id="perfscope-data" type="application/json">(.*?)</script>', re.S)


@pytest.fixture(scope="module")
def diag():
    return real_diagnosis


@pytest.fixture(scope="module")
def pages(tmp_path_factory, diag):
    """The report kinds, written once: diagnosis (graph, eager, multi-rank, run folder) and compare."""
    out = tmp_path_factory.mktemp("reports")
    pool = diag(H200 / "mla_pool_graph.json.xz")
    made = {
        "diagnosis": write_html(out / "diagnosis.html", render_diagnosis(pool)),
        "diagnosis-eager": write_html(out / "eager.html", render_diagnosis(diag(H200 / "mla_pool_eager.json.xz"))),
        "diagnosis-ranks": write_html(out / "ranks.html", render_diagnosis(
            diag(PUBLIC / "HolisticTraceAnalysis" / "tests" / "data" / "trace_filter"))),
    }
    for after in ("mla_fp8_graph", "mla_pages_graph"):
        a = diag(H200 / f"{after}.json.xz")
        c = compare(pool, a, labels=("mla_pool_graph", after))
        made[f"compare-{after}"] = write_html(out / f"compare-{after}.html", render_compare(c, pool, a))
    b, a = diag(QWEN / "h100" / "Qwen_Qwen1.5-0.5B-Chat__1016005.json.xz"), \
        diag(QWEN / "mi300" / "Qwen_Qwen1.5-0.5B-Chat__1016005.json.xz")
    made["compare-setups"] = write_html(out / "compare-setups.html",
                                        render_compare(compare(b, a, labels=("h100", "mi300")), b, a))
    ranks = diag(PUBLIC / "HolisticTraceAnalysis" / "tests" / "data" / "trace_filter")
    rank0 = diag(PUBLIC / "HolisticTraceAnalysis" / "tests" / "data" / "trace_filter" / "sampled_rank-0.json.xz")
    made["compare-ranks"] = write_html(out / "compare-ranks.html",
                                       render_compare(compare(rank0, ranks, labels=("rank0", "both")), rank0, ranks))
    return made


def blob(path: Path) -> dict:
    m = BLOB.findall(path.read_text())
    assert len(m) == 1, "exactly one JSON data blob"
    return json.loads(m[0])


# ---- the file -------------------------------------------------------------------------------- #

def test_page_is_one_self_contained_file(pages):
    for kind, path in pages.items():
        html = path.read_text()
        assert html.startswith("<!DOCTYPE html>")
        assert not re.search(r"<script[^>]+\bsrc=", html), f"{kind}: external script"
        assert not re.search(r"<link[^>]+rel=\"stylesheet\"", html), f"{kind}: external stylesheet"
        assert not re.search(r"<(img|iframe)[^>]+src=\"https?:", html)
        assert "Plotly" in html and len(html) > 3_000_000, "plotly.js is inlined"
        assert html.count("</script>") == 3  # data, plotly.js, page script: nothing in them closes a tag early
        assert blob(path)["kind"] in ("diagnosis", "compare")


def test_blob_holds_the_diagnosis_and_one_step(pages):
    data = blob(pages["diagnosis"])
    d = data["diagnosis"]
    assert d["steps"]["median_ms"] == pytest.approx(57.4, abs=1.0)
    assert [f["id"] for f in d["findings"]] == ["fp8-kv-cast"]
    tl = d["timeline"]
    assert len(tl["kernels"]) == 420 and sum(1 for k in tl["kernels"] if k[4] == "copy") == 60
    assert tl["streams"] == [7] and tl["span_ms"] == pytest.approx(57.4, abs=1.0)
    assert all("timeline" not in r for r in d["ranks"]), "no per-rank timelines: one step, once"
    assert data["bucket_order"][0] == "copy" and data["bucket_colors"]["copy"]


def test_idle_gaps_are_where_no_stream_runs():
    ks = [[7, 0.0, 1.0, "a", "gemm"], [8, 0.5, 1.0, "b", "copy"], [7, 2.0, 0.5, "c", "gemm"], [7, 2.5, 0.5, "d", "gemm"],
          [7, 4.0, 1.0, "e", "copy"]]
    assert idle_gaps(ks) == [[1.5, 0.5], [3.0, 1.0]]
    tl = timeline_data({"step": 0, "label": "s", "gpu_ms": 5.0, "truncated": False, "kernels": ks})
    assert tl["streams"] == [7, 8] and tl["idle_ms"] == 1.5 and tl["span_ms"] == 5.0
    assert timeline_data({}) == {}


def test_report_of_the_210mb_trace_stays_small(tmp_path, big_eager_trace):
    """The 120-step eager trace (171 MB of JSON): the report summarises, it does not embed events."""
    d = diagnose([big_eager_trace])
    path = write_html(tmp_path / "big.html", render_diagnosis(d))
    assert path.stat().st_size <= 10_000_000
    data = blob(path)["diagnosis"]
    assert len(data["per_step"]) == 120 and len(data["timeline"]["kernels"]) == 420


@pytest.mark.slow  # every shared trace rendered (~10 s)
def test_every_shared_trace_renders(diag):
    """Every usable trace in tests/traces/corpus gives a page (no template error on odd data: CPU-only,
    ROCm, SGLang graph decode, vLLM, multi-rank, training)."""
    skip = ("120steps", "execution_trace", "908_results")  # the last: rocprofiler-sdk JSON, refused
    n = 0
    for f in sorted(TRACES.rglob("*.json.xz")):
        if any(s in str(f) for s in skip):
            continue
        html = render_diagnosis(diag(f))
        assert blob_text(html)["kind"] == "diagnosis"
        n += 1
    assert n >= 20


def blob_text(html: str) -> dict:
    return json.loads(BLOB.findall(html)[0])


def test_write_html_refuses_a_folder(tmp_path):
    with pytest.raises(InputError, match="is a folder"):
        write_html(tmp_path, "<html></html>")
    (tmp_path / "afile").write_text("")
    with pytest.raises(InputError, match="cannot write"):
        write_html(tmp_path / "afile" / "x.html", "<html></html>")


# ---- the CLI --------------------------------------------------------------------------------- #

def test_cli_report_of_a_run_folder_shows_config_and_tpot(tmp_path):
    run = tmp_path / "run"
    (run / "traces").mkdir(parents=True)
    shutil.copyfile(H200 / "mla_pool_graph.json.xz", run / "traces" / "1730000000.0-TP-0-DECODE.trace.json.gz")
    write_run(run, command=["perfscope", "trace"], host="gpu1", versions={"sglang": "0.5.5", "flashinfer": "0.6.18"},
              server_info={"model_path": "deepseek-ai/DeepSeek-V3", "kv_cache_dtype": "fp8_e4m3",
                           "attention_backend": "flashinfer", "tp_size": 1, "max_total_num_tokens": 495000},
              timings={"ttft_ms": 120.0, "tpot_ms": 58.25}, files=[{"path": "traces/1730000000.0-TP-0-DECODE.trace.json.gz"}])
    r = invoke("report", run)
    assert r.returncode == 0, r.stderr
    html = (run / "report.html").read_text()
    for text in ("deepseek-ai/DeepSeek-V3", "fp8_e4m3", "58.25 ms", "TPOT measured by the client",
                 "perfscope fix fp8-kv-cast --apply", "0.5.5"):
        assert text in html, text
    assert blob_text(html)["diagnosis"]["run"]["timings"]["tpot_ms"] == 58.25


def test_cli_report_default_name_and_diagnose_html(tmp_path):
    r = invoke("report", H200 / "mla_fp8_graph.json.xz", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "mla_fp8_graph.report.html").is_file() and "report written" in r.stderr
    r = invoke("diagnose", H200 / "mla_pool_graph.json.xz", "--html", tmp_path / "d.html")
    assert r.returncode == 0, r.stderr
    assert "fp8-kv-cast" in r.stdout, "the tables still print"
    assert blob(tmp_path / "d.html")["diagnosis"]["findings"][0]["id"] == "fp8-kv-cast"
    r = invoke("report", H200 / "mla_fp8_graph.json.xz", "-o", tmp_path)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "is a folder" in r.stderr


# ---- in a real browser ----------------------------------------------------------------------- #

def check_rendered(res, n_charts: int, browser):
    assert res.console_errors == [] and res.page_errors == [], (res.console_errors, res.page_errors)
    assert res.blocked == [], f"the page asked the network for {res.blocked}"
    assert len(res.charts) == n_charts, res.charts
    for c in res.charts:
        assert c["plotly"] and c["svg"] >= 1 and c["traces"], c
    assert png_colours(browser, res.screenshot) > 100, "screenshot looks blank"


def test_diagnosis_page_in_chromium(pages, open_page, chromium):
    res = open_page(pages["diagnosis"], "diagnosis.png", select=("#top-finding", "#stat-step"))
    check_rendered(res, 2, chromium)
    tl = next(c for c in res.charts if c["id"] == "chart-timeline")
    # the 60 casts (18 px each at this zoom): every one its own bar, or two where a pixel of another
    # bucket's time falls inside it (the timeline draws each bucket's time per pixel: test_html_timeline.py)
    copy = next(t for t in tl["traces"] if t["name"] == "copy (60)")
    assert 60 <= copy["n"] <= 66, tl["traces"]
    assert "perfscope fix fp8-kv-cast" in res.texts["#top-finding"]  # the check (diff; then --apply)
    assert res.texts["#stat-step"].startswith("57.")
    for text in ("NVIDIA H200", "fp8-kv-cast", "495,000", "predicted step after fix", "Top ops per step"):
        assert text in res.text, text


def test_eager_page_shows_shapes_and_source(pages, open_page, chromium):
    res = open_page(pages["diagnosis-eager"], "diagnosis-eager.png")
    check_rendered(res, 2, chromium)
    assert "fp8_e4m3" in res.text and "[495000, 1, 576]" in res.text  # dtypes as engineers write them
    assert "mla_cast_repro.py" in res.text and "aten::to > aten::_to_copy" in res.text


def test_multi_rank_page_has_per_rank_bars(pages, open_page, chromium):
    res = open_page(pages["diagnosis-ranks"], "diagnosis-ranks.png")
    check_rendered(res, 3, chromium)
    ranks = next(c for c in res.charts if c["id"] == "chart-ranks")
    assert all(t["n"] == 2 for t in ranks["traces"]), "one bar per rank"
    assert "Per rank" in res.text


def test_ops_table_sorts_on_click(pages, chromium):
    def click(page):
        page.click("#ops-table th:nth-child(5)")  # count / step: descending first
        click.first = page.eval_on_selector_all("#ops-table tbody tr td:nth-child(5)", "els => els.map(e => e.dataset.v)")
        page.click("#ops-table th:nth-child(5)")
        click.second = page.eval_on_selector_all("#ops-table tbody tr td:nth-child(5)", "els => els.map(e => e.dataset.v)")
        page.click("#ops-table th:nth-child(1)")
        click.names = page.eval_on_selector_all("#ops-table tbody tr td:nth-child(1)", "els => els.map(e => e.dataset.v)")

    res = load_page(chromium, pages["diagnosis"], actions=click)
    assert res.console_errors == []
    first = [float(x) for x in click.first]
    assert first == sorted(first, reverse=True) and first[0] == 120
    assert [float(x) for x in click.second] == sorted(first)
    assert click.names == sorted(click.names, key=str.lower)


@pytest.mark.parametrize("after", ["mla_fp8_graph", "mla_pages_graph"])
def test_compare_page_in_chromium(pages, open_page, chromium, after):
    res = open_page(pages[f"compare-{after}"], "compare.png" if after == "mla_fp8_graph" else f"compare-{after}.png",
                    select=("#findings-gone", "#findings-new", "#stat-step", "#verdict", "#setup-flag"))
    check_rendered(res, 3, chromium)
    before_ms, after_ms = map(float, re.findall(r"[\d.]+", res.texts["#stat-step"])[:2])
    assert 55 <= before_ms <= 59 and 6 <= after_ms <= 8
    assert "fp8-kv-cast" in res.texts["#findings-gone"] and "fp8-kv-cast" not in res.texts["#findings-new"]
    assert res.texts["#setup-flag"] is None, "same setup: no flag"
    bars = next(c for c in res.charts if c["id"] == "chart-compare-buckets")
    assert {"name": "copy", "n": 2} in bars["traces"]
    assert "faster" in res.texts["#verdict"]
    copy_row = next(line for line in res.text.splitlines() if line.startswith("copy\t") or line.startswith("copy "))
    assert "50." in copy_row and "\u221250." in copy_row, copy_row  # 50.98 ms before, -50.x ms delta


def test_compare_page_flags_different_setups(pages, open_page, chromium):
    res = open_page(pages["compare-setups"], "compare-setups.png", select=("#setup-flag",))
    check_rendered(res, 3, chromium)
    assert "Different setups" in res.texts["#setup-flag"] and "MI300X" in res.texts["#setup-flag"]


def test_compare_page_with_several_ranks(pages, open_page, chromium):
    res = open_page(pages["compare-ranks"], "compare-ranks.png", select=("#setup-flag",))
    check_rendered(res, 4, chromium)
    ranks = next(c for c in res.charts if c["id"] == "chart-compare-ranks")
    assert all(t["n"] == 3 for t in ranks["traces"]), "1 rank before + 2 after"
    assert "trace files" in res.texts["#setup-flag"], "1 file vs 2 is flagged"


def test_cli_report_with_a_capture_trace_names_the_source(tmp_path):
    """SGLang decode replayed from a CUDA/HIP graph: the capture trace gives the ops their source lines."""
    s = QWEN / "inference" / "sglang_decode"
    out = tmp_path / "cap.html"
    r = invoke("report", s / "sglang_Qwen3-8B_decode.json.xz", "--capture-trace",
                  s / "capture_traces" / "bs_32_rank0.json.xz", "-o", out)
    assert r.returncode == 0, r.stderr
    html = out.read_text()
    assert "tuned_gemm.py" in html and "<th>source line</th>" in html
