"""The HTML step timeline shows each bucket's true share at the zoom it is drawn at, merges GPU-idle
gaps too short to see, and redraws at a finer scale when zoomed; its tables never break a number or
a shape across lines. Checked on the real H200 traces in real headless Chromium (tests/browser.py),
by the pixels of the rendered chart, not by the page's data alone."""

from __future__ import annotations

import pytest

from browser import eval_png, load_page  # the chromium fixture: tests/conftest.py (one browser per session)
from paths import H200
from perfscope.analysis.compare import compare
from perfscope.analysis.diagnose import diagnose
from perfscope.report.html import render_compare, render_diagnosis, write_html

# the pixels of one row of the rendered chart, classified by bucket colour (exact, within a small
# tolerance for anti-aliasing; other pixels - grid, edges - are not counted)
# (the body of browser.eval_png: px, c.width/c.height, arg = {bucket: "#rrggbb"})
ROW_PIXELS = """
    const colours = arg;
    const rgb = Object.fromEntries(Object.entries(colours).map(([k, h]) =>
        [k, [1, 3, 5].map(i => parseInt(h.slice(i, i + 2), 16))]));
    const rows = [];
    for (let y = 0; y < c.height; y++) {
        const n = {};
        for (let x = 0; x < c.width; x++) {
            const o = 4 * (y * c.width + x);
            for (const [k, [r, gg, b]] of Object.entries(rgb)) {
                if (Math.abs(px[o] - r) + Math.abs(px[o + 1] - gg) + Math.abs(px[o + 2] - b) <= 12) { n[k] = (n[k] || 0) + 1; break; }
            }
        }
        rows.push(n);
    }
    return rows;"""


def _timeline_pixels(browser, path, chart_id):
    """{bucket: pixels} on the busiest pixel row of the stream, the idle row's pixels, the chart's
    traces (name, bars) and its drawn kernels, read from the page in Chromium."""
    got = {}

    def act(page):
        el = page.locator(f"#{chart_id}")
        png = el.screenshot()
        colours = page.evaluate("() => JSON.parse(document.getElementById('perfscope-data').textContent).bucket_colors")
        idle = page.evaluate("() => JSON.parse(document.getElementById('perfscope-data').textContent).idle_color")
        rows = eval_png(page, png, ROW_PIXELS, {**colours, "(idle)": idle})
        stream = max(rows, key=lambda n: sum(v for k, v in n.items() if k != "(idle)"))
        got["stream"] = {k: v for k, v in stream.items() if k != "(idle)"}
        got["idle_px"] = max(n.get("(idle)", 0) for n in rows)
        got["traces"] = page.evaluate(f"() => document.getElementById('{chart_id}').data.map(t => [t.name, t.x.length])")
        got["width"] = page.evaluate(f"() => document.getElementById('{chart_id}')._fullLayout._size.w")
        # zoom in to the first 0.5 ms (as a drag would): redrawn at that scale, single kernels named
        page.evaluate(f"() => Plotly.relayout('{chart_id}', {{'xaxis.range': [0, 0.5]}})")
        page.wait_for_timeout(300)
        got["zoomed"] = page.evaluate(
            f"() => document.getElementById('{chart_id}').data.map(t => [t.name, t.x.length, (t.hovertext || []).slice(0, 3)])")
        got["range"] = page.evaluate(f"() => document.getElementById('{chart_id}').layout.xaxis.range")

    load_page(browser, path, screenshot=None, actions=act)
    return got


def _true_shares(tl: dict) -> dict:
    ms: dict = {}
    for stream, start, dur, short, bucket in tl["kernels"]:
        ms[bucket] = ms.get(bucket, 0.0) + dur
    tot = sum(ms.values())
    return {b: v / tot for b, v in ms.items()}


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    out = tmp_path_factory.mktemp("timeline")
    pool, fp8 = diagnose([H200 / "mla_pool_graph.json.xz"]), diagnose([H200 / "mla_fp8_graph.json.xz"])
    c = compare(pool, fp8, labels=("pool", "fp8"))
    return {"diagnosis": write_html(out / "fp8.html", render_diagnosis(fp8)),
            "compare": write_html(out / "compare.html", render_compare(c, pool, fp8)),
            "eager": write_html(out / "eager.html", render_diagnosis(diagnose([H200 / "mla_pool_eager.json.xz"]))),
            "fp8": fp8, "pool": pool}


@pytest.mark.parametrize("page,chart", [("diagnosis", "chart-timeline"), ("compare", "chart-timeline-after"),
                                        ("compare", "chart-timeline-before")])
def test_timeline_shows_each_buckets_true_share(chromium, reports, page, chart):
    got = _timeline_pixels(chromium, reports[page], chart)
    tl = (reports["pool"] if chart.endswith("before") else reports["fp8"]).primary.timeline
    want = _true_shares(tl)
    px = got["stream"]
    total = sum(px.values())
    assert total > 50, px
    for bucket, share in want.items():
        if share >= 0.02:
            assert abs(px.get(bucket, 0) / total - share) < 0.03, (chart, bucket, px, want)
    # the fixed step (after) is mostly GEMM, not the last colour drawn: the bug this replaced
    if chart != "chart-timeline-before":
        assert px.get("gemm", 0) > px.get("attention", 0)
    # idle gaps too short to see are merged: a few bars, not one tick per gap
    idle_name, idle_bars = got["traces"][0]
    n_gaps = int(idle_name.split("(")[1].split(" ")[0])
    assert n_gaps > 300 and idle_bars < 20, got["traces"]
    # zoomed to 0.5 ms: redrawn at that scale, where single kernels get their own bar and name
    assert got["range"] == [0, 0.5]
    zoomed = {name.split(" (")[0]: (n, text) for name, n, text in got["zoomed"]}
    assert any(n > 0 and any(" ms at +" in t for t in text) for b, (n, text) in zoomed.items() if b != "GPU idle")


def test_tables_never_break_numbers_or_shapes(chromium, reports):
    """Narrow window: the ops table's numbers and shapes, and the evidence values, each on one line."""
    got = {}

    def act(page):
        got["breaks"] = page.evaluate("""() => {
            const out = [];
            const one = el => { const r = el.getClientRects(); return r.length <= 1; };
            document.querySelectorAll("#ops-table td.num, #ops-table .shape, #bucket-table td.num, .finding td.num, .finding .shape")
                .forEach(el => { if (!one(el)) out.push(el.textContent); });
            return {broken: out, checked: document.querySelectorAll("#ops-table td.num, #ops-table .shape, .finding td.num").length,
                    shapes: Array.from(document.querySelectorAll("#ops-table .shape")).map(e => e.textContent).slice(0, 3)};
        }""")

    load_page(chromium, reports["eager"], width=700, actions=act)
    b = got["breaks"]
    assert b["checked"] > 30 and not b["broken"], b
    assert "[495000, 1, 576]" in b["shapes"]
