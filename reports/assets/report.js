/* perfscope report: draws the charts from the page's one JSON blob and sorts tables. No network. */
(function () {
  "use strict";
  var DATA = JSON.parse(document.getElementById("perfscope-data").textContent);
  var COLORS = DATA.bucket_colors, ORDER = DATA.bucket_order, IDLE = DATA.idle_color;
  var CONFIG = { displaylogo: false, responsive: true, modeBarButtonsToRemove: ["lasso2d", "select2d"] };
  var FONT = { family: "-apple-system, Segoe UI, Roboto, Arial, sans-serif", size: 12 };

  function fmt(ms) {
    if (ms === null || ms === undefined) return "-";
    var a = Math.abs(ms);
    return a < 10 ? ms.toFixed(3) : a < 100 ? ms.toFixed(2) : ms.toFixed(1);
  }
  function baseLayout(extra) {
    var l = { font: FONT, margin: { l: 70, r: 20, t: 10, b: 50 }, barmode: "stack", hovermode: "closest",
              legend: { orientation: "h", y: 1.12, x: 0, traceorder: "normal" }, plot_bgcolor: "#fff", paper_bgcolor: "#fff" };
    for (var k in extra) l[k] = extra[k];
    return l;
  }
  function used(rows, get) {  /* buckets with time somewhere in rows, in the canonical order */
    return ORDER.filter(function (b) { return rows.some(function (r) { return (get(r, b) || 0) > 0; }); });
  }
  function stacked(xs, rows, get, idle) {
    var traces = used(rows, get).map(function (b) {
      return { type: "bar", name: b, x: xs, y: rows.map(function (r) { return get(r, b) || 0; }),
               marker: { color: COLORS[b] || "#ccc" }, hovertemplate: b + ": %{y:.3f} ms<extra>%{x}</extra>" };
    });
    if (idle) traces.push({ type: "bar", name: "GPU idle", x: xs, y: rows.map(idle),
                            marker: { color: IDLE }, hovertemplate: "idle: %{y:.3f} ms<extra>%{x}</extra>" });
    return traces;
  }

  /* ---- charts ---------------------------------------------------------------------------- */
  function chartBuckets(el) {
    var d = DATA.diagnosis, steps = d.per_step;
    var xs = steps.map(function (s, i) { return s.label || ("step " + (s.index !== undefined ? s.index : i)); });
    var traces = stacked(xs, steps, function (s, b) { return s.buckets[b]; }, function (s) { return s.idle_ms || 0; });
    Plotly.newPlot(el, traces, baseLayout({ yaxis: { title: { text: "ms per step" } },
      xaxis: { type: "category", title: { text: (d.steps.phase || "") + " step" } } }), CONFIG);
  }
  function chartRanks(el) {
    var ranks = DATA.diagnosis.ranks;
    var xs = ranks.map(function (r, i) { return "rank " + (r.rank === null ? i : r.rank) + (r.stage ? " " + r.stage : ""); });
    var traces = stacked(xs, ranks, function (r, b) { return r.buckets[b] ? r.buckets[b].ms_per_step : 0; },
                         function (r) { return r.idle_ms_per_step || 0; });
    Plotly.newPlot(el, traces, baseLayout({ yaxis: { title: { text: "ms per step (median step)" } },
      xaxis: { type: "category" } }), CONFIG);
  }
  function chartCompareBuckets(el) {
    var c = DATA.compare;
    var xs = ["before: " + c.before.label, "after: " + c.after.label];
    var rows = [0, 1];
    var byName = {};
    c.buckets.forEach(function (r) { byName[r.bucket] = r; });
    var traces = stacked(xs, rows, function (i, b) {
      var r = byName[b]; return r ? (i === 0 ? r.before_ms : r.after_ms) : 0;
    }, function (i) { return (i === 0 ? c.idle.before_ms : c.idle.after_ms) || 0; });
    Plotly.newPlot(el, traces, baseLayout({ yaxis: { title: { text: "ms per step" } },
      xaxis: { type: "category" } }), CONFIG);
  }
  function chartCompareRanks(el) {
    var rows = [], xs = [];
    ["before", "after"].forEach(function (side) {
      DATA.per_rank[side].forEach(function (r, i) {
        rows.push(r);
        xs.push(side + " rank " + (r.rank === null ? i : r.rank) + (r.stage ? " " + r.stage : ""));
      });
    });
    var traces = stacked(xs, rows, function (r, b) { return r.buckets[b] ? r.buckets[b].ms_per_step : 0; },
                         function (r) { return r.idle_ms_per_step || 0; });
    Plotly.newPlot(el, traces, baseLayout({ yaxis: { title: { text: "ms per step" } },
      xaxis: { type: "category" } }), CONFIG);
  }
  function chartTimeline(el, tl, xmax) {
    var IDLE_ROW = "GPU idle";
    var rowOf = function (s) { return "stream " + s; };
    var rows = [IDLE_ROW].concat(tl.streams.map(rowOf));
    var groups = {};
    tl.kernels.forEach(function (k) {  /* [stream, start_ms, dur_ms, short, bucket] */
      var g = groups[k[4]] || (groups[k[4]] = { x: [], base: [], y: [], text: [] });
      g.x.push(k[2]); g.base.push(k[1]); g.y.push(rowOf(k[0]));
      g.text.push(k[3] + "<br>" + fmt(k[2]) + " ms at +" + fmt(k[1]) + " ms");
    });
    var traces = ORDER.concat(Object.keys(groups).filter(function (b) { return ORDER.indexOf(b) < 0; }))
      .filter(function (b) { return groups[b]; })
      .map(function (b) {
        var g = groups[b];
        return { type: "bar", orientation: "h", name: b + " (" + g.x.length + ")", x: g.x, base: g.base, y: g.y,
                 hovertext: g.text, hoverinfo: "text", marker: { color: COLORS[b] || "#ccc", line: { width: 0 } },
                 width: 0.7 };
      });
    traces.unshift({ type: "bar", orientation: "h", name: "GPU idle (" + tl.gaps.length + " gaps, " + fmt(tl.idle_ms) + " ms)",
      x: tl.gaps.map(function (g) { return g[1]; }), base: tl.gaps.map(function (g) { return g[0]; }),
      y: tl.gaps.map(function () { return IDLE_ROW; }),
      hovertext: tl.gaps.map(function (g) { return "idle " + fmt(g[1]) + " ms at +" + fmt(g[0]) + " ms"; }),
      hoverinfo: "text", marker: { color: IDLE, line: { width: 0 } }, width: 0.7 });
    el.style.height = Math.max(200, 110 + 44 * rows.length) + "px";
    Plotly.newPlot(el, traces, baseLayout({
      barmode: "overlay", bargap: 0.2,
      xaxis: { title: { text: "ms from the step's first kernel" }, range: [0, xmax || tl.span_ms], zeroline: false },
      yaxis: { type: "category", categoryorder: "array", categoryarray: rows.slice().reverse(), fixedrange: true },
      margin: { l: 80, r: 20, t: 10, b: 45 }
    }), CONFIG);
  }

  function draw(el) {
    var kind = el.getAttribute("data-chart");
    if (kind === "buckets") return chartBuckets(el);
    if (kind === "ranks") return chartRanks(el);
    if (kind === "compare-buckets") return chartCompareBuckets(el);
    if (kind === "compare-ranks") return chartCompareRanks(el);
    if (kind === "timeline") {
      if (DATA.kind === "compare") {
        var t = DATA.timelines, side = el.getAttribute("data-side");
        var xmax = Math.max(t.before.span_ms || 0, t.after.span_ms || 0);
        return chartTimeline(el, t[side], xmax);
      }
      return chartTimeline(el, DATA.diagnosis.timeline);
    }
    throw new Error("perfscope: unknown chart kind " + kind);
  }

  /* ---- sortable tables ------------------------------------------------------------------- */
  function cellKey(td) {
    var v = td.hasAttribute("data-v") ? td.getAttribute("data-v") : td.textContent.trim();
    var n = parseFloat(v);
    return isNaN(n) || !/^[-+0-9.eE]+$/.test(v) ? v.toLowerCase() : n;
  }
  function makeSortable(table) {
    var heads = table.tHead.rows[0].cells;
    Array.prototype.forEach.call(heads, function (th, col) {
      th.addEventListener("click", function () {
        var body = table.tBodies[0], rows = Array.prototype.slice.call(body.rows);
        var numeric = rows.length && typeof cellKey(rows[0].cells[col]) === "number";
        var desc = th.classList.contains("asc") || (!th.classList.contains("desc") && numeric);
        Array.prototype.forEach.call(heads, function (h) { h.classList.remove("asc", "desc"); });
        th.classList.add(desc ? "desc" : "asc");
        rows.sort(function (a, b) {
          var x = cellKey(a.cells[col]), y = cellKey(b.cells[col]);
          var r = (typeof x === typeof y) ? (x < y ? -1 : x > y ? 1 : 0) : (typeof x === "number" ? -1 : 1);
          return desc ? -r : r;
        });
        rows.forEach(function (r) { body.appendChild(r); });
      });
    });
  }

  document.querySelectorAll("table.sortable").forEach(makeSortable);
  document.querySelectorAll("[data-chart]").forEach(function (el) {
    try { draw(el); } catch (e) { console.error("perfscope chart " + el.id + ": " + e); }
  });
})();
