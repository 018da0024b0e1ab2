"""Self-contained HTML reports: one file, plotly.js and the data inside, no network.

A page is a jinja2 template (``reports/templates/*.html.j2``) with the stylesheet, the page script
(``reports/assets/``) and plotly.js (from the installed ``plotly`` package) inlined, and ONE JSON
data blob (``<script id="perfscope-data" type="application/json">``). Text and tables are rendered
here on the server side; the charts are drawn in the browser from the blob by
``reports/assets/report.js``. Analysis code never plots: this module only reads a
:class:`~perfscope.analysis.result.Diagnosis` (or :func:`perfscope.analysis.compare.compare`'s dict).

Size: the blob holds summaries (top ops, per-step buckets, one representative step's kernels for
the primary rank), never the trace's events, so a report stays a few MB (plotly.js is ~4.6 MB of
it) whatever the trace's size.
"""

from __future__ import annotations

import datetime as _dt
from functools import lru_cache
from pathlib import Path
from typing import Any, Optional

import orjson

from perfscope import __version__
from perfscope.analysis.buckets import BUCKETS
from perfscope.analysis.gpus import device_label
from perfscope.analysis.result import Diagnosis, RankAnalysis
from perfscope.errors import InputError
from perfscope.report.html_filters import (
    code_spans,
    evidence_value,
    fmt_ms,
    op_columns,
    op_table_columns,
    pct,
    plain_lines,
    signed_ms,
    signed_pct,
)
from perfscope.report.view import diagnosis_json, view
from perfscope.report.wording import (
    evidence_pairs,
    gpu_arch,
    graph_word,
    ms_range,
    per_step_count as count,
    skipped_note,
)
from perfscope.util.files import atomic_write_text, resource_dir

# One colour per bucket (the hues of the terminal's BUCKET_STYLE), and the idle gaps.
BUCKET_COLORS = {
    "copy": "#d62728",
    "gemm": "#1f77b4",
    "attention": "#9467bd",
    "communication": "#e6a700",
    "moe": "#17becf",
    "sampling": "#2ca02c",
    "elementwise": "#7f7f7f",
    "other": "#c7c7c7",
}
IDLE_COLOR = "#f2c4a0"

# Config keys shown in the header when the server's config is known (run folder or --config).
HEADER_CONFIG_KEYS = (
    "model_path",
    "served_model_name",
    "tp_size",
    "dp_size",
    "ep_size",
    "pp_size",
    "dtype",
    "quantization",
    "kv_cache_dtype",
    "attention_backend",
    "decode_attention_backend",
    "page_size",
    "disable_cuda_graph",
    "cuda_graph_max_bs",
    "disable_custom_all_reduce",
    "disable_overlap_schedule",
    "chunked_prefill_size",
    "sampling_backend",
    "max_total_num_tokens",
    "version",
)

MAX_OPS = 60  # rows in the ops table
MAX_RANK_OPS = 20  # ops kept per non-primary rank in the blob
MAX_STACK = 8  # python frames kept per op
MIN_GAP_MS = 1e-5  # gaps shorter than 10 ns are rounding, not idle time


# --------------------------------------------------------------------------------------------- #
# page data (the JSON blob)


def idle_gaps(kernels: list[list], min_ms: float = MIN_GAP_MS) -> list[list[float]]:
    """[[start_ms, dur_ms], ...]: stretches of the step where no stream runs a kernel."""
    spans = sorted((k[1], k[1] + k[2]) for k in kernels)
    gaps = []
    end = None
    for s, e in spans:
        if end is not None and s - end >= min_ms:
            gaps.append([round(end, 5), round(s - end, 5)])
        end = e if end is None else max(end, e)
    return gaps


def timeline_data(tl: dict) -> dict:
    """The representative step as the page draws it: kernels, streams and the idle gaps between them."""
    if not tl or not tl.get("kernels"):
        return {}
    ks = tl["kernels"]
    gaps = idle_gaps(ks)
    return {
        **tl,
        "streams": sorted({k[0] for k in ks}, key=lambda s: (str(type(s)), s)),
        "gaps": gaps,
        "idle_ms": round(sum(g[1] for g in gaps), 5),
        "span_ms": round(max(k[1] + k[2] for k in ks), 5),
    }


STAGE_WORDS = {"EXTEND": "EXTEND stage (prefill)", "DECODE": "DECODE stage"}


def rank_labels(ranks: list) -> tuple[list[str], str]:
    """Chart labels for the per-rank files, and the section's title: SGLang writes one file per rank
    *and stage* (EXTEND = prefill, DECODE); one rank's stages are labelled as stages, not ranks."""

    def get(r, k):
        return r.get(k) if isinstance(r, dict) else getattr(r, k)

    ids = {get(r, "rank") for r in ranks}
    stages = {get(r, "stage") for r in ranks} - {None}
    labels = []
    for i, r in enumerate(ranks):
        rank, stage = get(r, "rank"), get(r, "stage")
        st = STAGE_WORDS.get(stage, f"{stage} stage") if stage else ""
        if len(ids) == 1 and stages:
            labels.append(st or f"file {i}")
        else:
            labels.append(f"rank {rank if rank is not None else i}" + (f" · {st}" if st else ""))
    title = "Per stage" if len(ids) == 1 and stages else "Per rank and stage" if stages else "Per rank"
    return labels, title


def _slim_op(o: dict) -> dict:
    o = dict(o)
    if o.get("stack"):
        o["stack"] = o["stack"][:MAX_STACK]
    return o


def diagnosis_data(d: Diagnosis) -> dict:
    """``--json``'s diagnosis (:func:`perfscope.report.view.diagnosis_json`) trimmed for a page: no per-rank
    timelines (the primary's one is under ``timeline``), short stacks, fewer ops for the other ranks."""
    out = diagnosis_json(d)
    p = d.primary
    out["ops"] = [_slim_op(o) for o in out["ops"][:MAX_OPS]]
    ranks = []
    for r in out["ranks"]:
        r = dict(r)
        r.pop("timeline", None)
        r["ops"] = [_slim_op(o) for o in r["ops"][:MAX_RANK_OPS]]
        for f in r.get("findings") or []:
            f.get("evidence", {}).pop("kernel", None)
        ranks.append(r)
    labels, _ = rank_labels(ranks)
    for r, lab in zip(ranks, labels):
        r["label"] = lab
    out["ranks"] = ranks
    out["timeline"] = timeline_data(p.timeline)
    out["per_step"] = p.per_step
    out["primary_index"] = d.ranks.index(p)
    return out


def _blob(obj: Any) -> str:
    """JSON for a ``<script type="application/json">``: nothing in it can close the tag."""
    raw = orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS, default=str).decode()
    return raw.replace("</", "<\\/").replace("<!--", "<\\u0021--")


def server_config(d: Diagnosis, config: Optional[dict] = None) -> dict:
    info = dict((d.run or {}).get("server_info") or {})
    info.update(config or {})
    return {k: info[k] for k in HEADER_CONFIG_KEYS if k in info and info[k] not in (None, "")}


def _header(d: Diagnosis, config: Optional[dict]) -> dict:
    p = d.primary
    m = p.meta
    run = d.run or {}
    timings = d.timings
    v = view(d).top  # the verdict, as the terminal and Markdown show it
    gpus = run.get("gpu") or []
    return {
        "device": m.get("device_name")
        or (gpus[0].get("name") if gpus and isinstance(gpus[0], dict) else None)
        or device_label(m),  # the trace's name, else nvidia-smi's on the host, else the table's match
        "compute_capability": m.get("compute_capability"),
        "arch": gpu_arch(m),  # sm 9.0 / gfx942
        "graph": graph_word(m),
        "num_sms": m.get("num_sms"),
        "mem_gb": round(m["total_mem_bytes"] / 2**30, 1) if m.get("total_mem_bytes") else None,
        "platform": m.get("platform"),
        "files": len(d.ranks),
        "world_size": m.get("world_size"),
        "config": server_config(d, config),
        "versions": run.get("versions") or {},
        "host": run.get("host"),
        "created": run.get("created"),
        "workload": run.get("workload") or {},
        "tpot_ms": timings.get("tpot_ms"),
        "ttft_ms": timings.get("ttft_ms"),
        "top": v.finding if v else None,
        "top_fix": v.fix if v else None,
        "cpu": p.steps.cpu_only,  # a CPU-only trace: no GPU, no GPU idle
    }


@lru_cache(maxsize=1)
def plotly_js() -> str:
    """plotly.js from the installed plotly package (what ``plotly.offline.get_plotlyjs()`` returns),
    read from the package's data without importing plotly (0.2 s of imports)."""
    import importlib.util

    spec = importlib.util.find_spec("plotly")
    js = None
    for loc in (spec.submodule_search_locations or []) if spec else []:
        f = Path(loc) / "package_data" / "plotly.min.js"
        if f.is_file():
            js = f.read_text(encoding="utf-8")
            break
    if js is None:
        from plotly.offline import get_plotlyjs

        js = get_plotlyjs()
    return js.replace("</script", "<\\/script")


@lru_cache(maxsize=1)
def _env():
    import jinja2

    root = resource_dir("reports")
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(root / "templates")),
        autoescape=jinja2.select_autoescape(["html", "j2"]),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        ms=fmt_ms, pct=pct, count=count, signed_ms=signed_ms, signed_pct=signed_pct, ev=evidence_value, code=code_spans
    )
    env.globals.update(
        skipped_note=skipped_note,
        ms_range=ms_range,
        op_columns=op_columns,
        evidence_pairs=evidence_pairs,
        op_table_columns=op_table_columns,
        bucket_colors=BUCKET_COLORS,
        idle_color=IDLE_COLOR,
        bucket_order=BUCKETS,
    )
    return env


def _asset(name: str) -> str:
    return (resource_dir("reports") / "assets" / name).read_text(encoding="utf-8")


def _render(template: str, data: dict, **ctx: Any) -> str:
    env = _env()
    data = {**data, "bucket_order": list(BUCKETS), "bucket_colors": BUCKET_COLORS, "idle_color": IDLE_COLOR}
    return env.get_template(template).render(
        data_json=_blob(data),
        plotly_js=plotly_js(),
        css=_asset("report.css"),
        script=_asset("report.js").replace("</script", "<\\/script"),
        version=__version__,
        generated=_dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
        **ctx,
    )


# --------------------------------------------------------------------------------------------- #
# public API


def render_diagnosis(d: Diagnosis, config: Optional[dict] = None, title: Optional[str] = None) -> str:
    """The breakdown report of one diagnosis, as an HTML string."""
    p: RankAnalysis = d.primary
    data: dict[str, Any] = {"kind": "diagnosis", "diagnosis": diagnosis_data(d)}
    order = [b for b in BUCKETS if p.buckets.get(b, {}).get("ms_per_step")]
    name = title or (Path(d.ranks[0].file).name if len(d.ranks) == 1 else f"{len(d.ranks)} trace files")
    return _render(
        "diagnosis.html.j2",
        data,
        d=d,
        p=p,
        h=_header(d, config),
        buckets_present=order,
        findings=view(d).findings,
        timeline=data["diagnosis"]["timeline"],
        title=name,
        ranks_title=rank_labels(d.ranks)[1],
    )


def render_compare(cmp: dict, before: Diagnosis, after: Diagnosis) -> str:
    """The before/after report of :func:`perfscope.analysis.compare.compare`, as an HTML string."""
    data = {
        "kind": "compare",
        "compare": cmp,
        "timelines": {"before": timeline_data(before.primary.timeline), "after": timeline_data(after.primary.timeline)},
        "per_rank": {
            side: [
                {
                    "rank": r.rank,
                    "stage": r.stage,
                    "buckets": r.buckets,
                    "label": lab,
                    "idle_ms_per_step": r.idle_ms_per_step,
                    "median_ms": r.steps.median_ms,
                }
                for r, lab in zip(dg.ranks, rank_labels(dg.ranks)[0])
            ]
            for side, dg in (("before", before), ("after", after))
        },
    }
    ranks_title = rank_labels(before.ranks)[1] if len(before.ranks) >= len(after.ranks) else rank_labels(after.ranks)[1]
    cpu = all(cmp[k].get("analysed_on") == "cpu-ops" for k in ("before", "after"))
    return _render(
        "compare.html.j2",
        data,
        c=cmp,
        timelines=data["timelines"],
        per_rank=data["per_rank"],
        said=plain_lines(cmp),
        cpu=cpu,
        title=f"{cmp['before']['label']} vs {cmp['after']['label']}",
        ranks_title=ranks_title,
    )


def write_html(path: str | Path, html: str) -> Path:
    """Write the page atomically; a path that cannot be written is an InputError."""
    path = Path(path)
    if path.is_dir():
        raise InputError(f"{path}: is a folder; give the report's file name (e.g. {path / 'report.html'})")
    try:  # a report is for sharing: the umask's mode, as for every file perfscope writes for the user
        return atomic_write_text(path, html, shared=True)
    except OSError as e:
        raise InputError(f"{path}: cannot write the report ({e.strerror or e})") from None


def write_diagnosis_html(path: str | Path, d: Diagnosis, config: Optional[dict] = None, announce=None) -> Path:
    """Render and write the breakdown report; ``announce`` (a rich Console) gets a one-line note."""
    out = write_html(path, render_diagnosis(d, config=config))
    if announce is not None:
        announce.print(f"report written: {out} ({out.stat().st_size / 1e6:.1f} MB)", highlight=False, markup=False)
    return out
