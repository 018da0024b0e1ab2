/* perfscope report: draws the charts from the page's one JSON blob and sorts tables. No network. */
(function () {
  "use strict";
  var DATA = JSON.parse(document.getElementById("perfscope-data").textContent);
  var COLORS = DATA.bucket_colors, ORDER = DATA.bucket_order, IDLE = DATA.idle_color;
  var CONFIG = { displaylogo: false, responsive: true, modeBarButtonsToRemove: ["lasso2d", "select2d"] };
  /* a CPU-only trace (its CPU ops analysed): no GPU, no streams, no "GPU idle" */
  var CPU = DATA.diagnosis ? DATA.diagnosis.steps.analysed_on === "cpu-ops"
    : !!(DATA.compare && DATA.compare.before.analysed_on === "cpu-ops" && DATA.compare.after.analysed_on === "cpu-ops");
  var FONT = { family: "-apple-system, Segoe UI, Roboto, Arial, sans-serif", size: 12 };

  /* Plotly draws axis labels, legend names and hover text as a small HTML subset (<a href>, <b>,
     <span style>, <br>): every string from the trace passes plotlyText, so it shows as the text it
     is (Plotly turns the entities back into characters). */
  function plotlyText(s) {
    return String(s).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
  }
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
  function stacked(xs, rows, get, idle, idleName) {
    var traces = used(rows, get).map(function (b) {
      return { type: "bar", name: plotlyText(b), x: xs, y: rows.map(function (r) { return get(r, b) || 0; }),
               marker: { color: COLORS[b] || "#ccc" }, hovertemplate: plotlyText(b) + ": %{y:.3f} ms<extra>%{x}</extra>" };
    });
    if (idle) traces.push({ type: "bar", name: idleName || "GPU idle", x: xs, y: rows.map(idle),
                            marker: { color: IDLE }, hovertemplate: "idle: %{y:.3f} ms<extra>%{x}</extra>" });
    return traces;
  }

  /* ---- charts ---------------------------------------------------------------------------- */
  function chartBuckets(el) {
    var d = DATA.diagnosis, steps = d.per_step;
    /* one bar per step: SGLang labels every decode step alike (step[DECODE bs=1]), and a category axis
       stacks bars of the same label into one */
    var xs = steps.map(function (s, i) { return plotlyText("#" + (s.index !== undefined ? s.index : i) + (s.label ? " " + s.label : "")); });
    var cpu = d.steps.analysed_on === "cpu-ops";
    var traces = stacked(xs, steps, function (s, b) { return s.buckets[b]; }, function (s) { return s.idle_ms || 0; },
                         cpu ? "idle" : "GPU idle");
    Plotly.newPlot(el, traces, baseLayout({ yaxis: { title: { text: "ms per step" } },
      xaxis: { type: "category", title: { text: (d.steps.phase || "") + " step" } } }), CONFIG);
  }
  function chartRanks(el) {
    var ranks = DATA.diagnosis.ranks;
    var xs = ranks.map(function (r, i) { return plotlyText(r.label || ("rank " + (r.rank === null ? i : r.rank))); });
    var traces = stacked(xs, ranks, function (r, b) { return r.buckets[b] ? r.buckets[b].ms_per_step : 0; },
                         function (r) { return r.idle_ms_per_step || 0; });
    Plotly.newPlot(el, traces, baseLayout({ yaxis: { title: { text: "ms per step (median step)" } },
      xaxis: { type: "category" } }), CONFIG);
  }
  function chartCompareBuckets(el) {
    var c = DATA.compare;
    var xs = [plotlyText("before: " + c.before.label), plotlyText("after: " + c.after.label)];
    var rows = [0, 1];
    var byName = {};
    c.buckets.forEach(function (r) { byName[r.bucket] = r; });
    var traces = stacked(xs, rows, function (i, b) {
      var r = byName[b]; return r ? (i === 0 ? r.before_ms : r.after_ms) : 0;
    }, function (i) { return (i === 0 ? c.idle.before_ms : c.idle.after_ms) || 0; },
    c.before.analysed_on === "cpu-ops" && c.after.analysed_on === "cpu-ops" ? "idle" : "GPU idle");
    /* sides 20x or more apart: a linear axis draws the smaller as a sliver (943 ms vs 7 ms: nothing); a log axis shows both */
    var tot = [c.step.before_ms || 0, c.step.after_ms || 0];
    var log = Math.min(tot[0], tot[1]) > 0 && Math.max(tot[0], tot[1]) / Math.min(tot[0], tot[1]) >= 20;
    var y = { title: { text: "ms per step" + (log ? " (log scale: the sides differ 20x or more)" : "") } };
    if (log) y.type = "log";
    Plotly.newPlot(el, traces, baseLayout({ yaxis: y, xaxis: { type: "category" } }), CONFIG);
  }
  function chartCompareRanks(el) {
    var rows = [], xs = [];
    ["before", "after"].forEach(function (side) {
      DATA.per_rank[side].forEach(function (r, i) {
        rows.push(r);
        xs.push(plotlyText(side + ": " + (r.label || ("rank " + (r.rank === null ? i : r.rank)))));
      });
    });
    var traces = stacked(xs, rows, function (r, b) { return r.buckets[b] ? r.buckets[b].ms_per_step : 0; },
                         function (r) { return r.idle_ms_per_step || 0; });
    Plotly.newPlot(el, traces, baseLayout({ yaxis: { title: { text: "ms per step" } },
      xaxis: { type: "category" } }), CONFIG);
  }
  /* The step timeline at the zoom shown: one bin per screen pixel of each row; a bin goes to the
     bucket (or to idle) owed the most time so far, owed time carried from bin to bin (error
     diffusion). So every bucket covers as many pixels as its time at that zoom (a run of sub-pixel
     kernels no longer paints the row in whichever colour is drawn last), and idle gaps shorter than
     a pixel merge into what they add up to instead of one tick each. Runs of one colour are one bar;
     zooming in (drag) redraws at the new scale, down to single kernels. */
  function binRow(items, a, b, nbin, keyOf) {  /* items: [start, dur, key, label]; -> runs */
    var w = (b - a) / nbin, busy = [], keys = {}, i, j;
    for (i = 0; i < nbin; i++) busy.push({});
    items.forEach(function (it) {
      var s = Math.max(it[0], a), e = Math.min(it[0] + it[1], b);
      if (e <= s) return;
      var k = keyOf(it); keys[k] = 1;
      for (j = Math.max(0, Math.floor((s - a) / w)); j < nbin && a + j * w < e; j++) {
        var lo = Math.max(s, a + j * w), hi = Math.min(e, a + (j + 1) * w);
        if (hi > lo) busy[j][k] = (busy[j][k] || 0) + (hi - lo);
      }
    });
    var owed = { "": 0 }, runs = [], cur = null;
    Object.keys(keys).forEach(function (k) { owed[k] = 0; });
    for (j = 0; j < nbin; j++) {
      var used = 0, best = "", k;
      for (k in busy[j]) { owed[k] += busy[j][k]; used += busy[j][k]; }
      owed[""] += Math.max(0, w - used);
      for (k in owed) if (owed[k] > owed[best] + 1e-12) best = k;
      owed[best] -= w;
      if (cur && cur.key === best) { cur.n += 1; }
      else { cur = { key: best, j0: j, n: 1 }; runs.push(cur); }
    }
    return runs.filter(function (r) { return r.key !== ""; }).map(function (r) {
      var x0 = a + r.j0 * w, x1 = x0 + r.n * w;
      var inside = items.filter(function (it) { return keyOf(it) === r.key && it[0] < x1 && it[0] + it[1] > x0; });
      return { key: r.key, x0: x0, x1: x1, items: inside };
    });
  }
  function timelineTraces(tl, a, b, nbin) {
    var IDLE_ROW = CPU ? "idle" : "GPU idle", rowOf = function (s) { return plotlyText((CPU ? "thread " : "stream ") + s); };
    var groups = {}, counts = {};
    tl.kernels.forEach(function (k) { counts[k[4]] = (counts[k[4]] || 0) + 1; });
    tl.streams.forEach(function (st) {
      var items = tl.kernels.filter(function (k) { return k[0] === st; })
        .map(function (k) { return [k[1], k[2], k[4], k[3]]; });
      binRow(items, a, b, nbin, function (it) { return it[2]; }).forEach(function (r) {
        var g = groups[r.key] || (groups[r.key] = { x: [], base: [], y: [], text: [] });
        var ms = r.items.reduce(function (t, it) { return t + Math.min(it[0] + it[1], r.x1) - Math.max(it[0], r.x0); }, 0);
        g.x.push(r.x1 - r.x0); g.base.push(r.x0); g.y.push(rowOf(st));
        g.text.push(r.items.length === 1 ? plotlyText(r.items[0][3]) + "<br>" + fmt(r.items[0][1]) + " ms at +" + fmt(r.items[0][0]) + " ms"
                    : plotlyText(r.key) + ": " + r.items.length + " kernels, " + fmt(ms) + " ms<br>+" + fmt(r.x0) + " to +" + fmt(r.x1) + " ms");
      });
    });
    var traces = ORDER.concat(Object.keys(groups).filter(function (b) { return ORDER.indexOf(b) < 0; }))
      .filter(function (b) { return groups[b]; })
      .map(function (bk) {
        var g = groups[bk];
        return { type: "bar", orientation: "h", name: plotlyText(bk) + " (" + counts[bk] + ")", x: g.x, base: g.base, y: g.y,
                 hovertext: g.text, hoverinfo: "text", marker: { color: COLORS[bk] || "#ccc", line: { width: 0 } },
                 width: 0.7, meta: { bucket: bk } };
      });
    var idle = binRow(tl.gaps.map(function (g) { return [g[0], g[1], "idle", ""]; }), a, b, nbin,
                      function () { return "idle"; });
    traces.unshift({ type: "bar", orientation: "h", name: IDLE_ROW + " (" + tl.gaps.length + " gaps, " + fmt(tl.idle_ms) + " ms)",
      x: idle.map(function (r) { return r.x1 - r.x0; }), base: idle.map(function (r) { return r.x0; }),
      y: idle.map(function () { return IDLE_ROW; }),
      hovertext: idle.map(function (r) {
        var ms = r.items.reduce(function (t, it) { return t + it[1]; }, 0);
        return r.items.length === 1 ? "idle " + fmt(ms) + " ms at +" + fmt(r.items[0][0]) + " ms"
               : "idle " + fmt(ms) + " ms in " + r.items.length + " gaps, +" + fmt(r.x0) + " to +" + fmt(r.x1) + " ms";
      }),
      hoverinfo: "text", marker: { color: IDLE, line: { width: 0 } }, width: 0.7, meta: { bucket: "idle" } });
    return { traces: traces, rows: [IDLE_ROW].concat(tl.streams.map(rowOf)) };
  }
  function chartTimeline(el, tl, xmax) {
    var full = [0, xmax || tl.span_ms];
    var margin = { l: 80, r: 20, t: 10, b: 45 };
    var nbinOf = function () { return Math.max(50, Math.round((el.clientWidth || 1000) - margin.l - margin.r)); };
    var built = timelineTraces(tl, full[0], full[1], nbinOf());
    el.style.height = Math.max(200, 110 + 44 * built.rows.length) + "px";
    var layout = baseLayout({
      barmode: "overlay", bargap: 0.2,
      xaxis: { title: { text: "ms from the step's first kernel" }, range: full.slice(), zeroline: false },
      yaxis: { type: "category", categoryorder: "array", categoryarray: built.rows.slice().reverse(), fixedrange: true },
      margin: margin
    });
    Plotly.newPlot(el, built.traces, layout, CONFIG);
    el.perfscopeTimeline = { tl: tl, full: full };
    var busy = false;
    el.on("plotly_relayout", function (ev) {
      if (busy) return;
      var r0 = ev["xaxis.range[0]"], r1 = ev["xaxis.range[1]"];
      if (ev["xaxis.range"]) { r0 = ev["xaxis.range"][0]; r1 = ev["xaxis.range"][1]; }
      var range = (ev["xaxis.autorange"] || r0 === undefined) ? full : [Math.max(0, r0), r1];
      busy = true;
      var t = timelineTraces(tl, range[0], range[1], nbinOf());
      layout.xaxis.range = range.slice();
      layout.xaxis.autorange = false;
      Plotly.react(el, t.traces, layout, CONFIG).then(function () { busy = false; }, function () { busy = false; });
    });
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
