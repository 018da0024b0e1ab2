"""The tables and line blocks of the terminal report: time per bucket, the dominant ops and who launched
them, the ranks, the ops against their roofline and the step against its floor."""

from __future__ import annotations

from typing import Optional

from rich.console import Group
from rich.table import Table
from rich.text import Text

from perfscope.analysis.ops import Op
from perfscope.analysis.result import Diagnosis, RankAnalysis
from perfscope.report import wording
from perfscope.report.escape import markup as escape, term
from perfscope.report.textfit import BoundaryText, cut_name as _cut_name, hanging

BUCKET_STYLE = {
    "copy": "red",
    "gemm": "blue",
    "attention": "magenta",
    "communication": "yellow",
    "moe": "cyan",
    "sampling": "green",
    "elementwise": "bright_black",
    "other": "white",
}


def _bar(share: float, width: int = 24) -> str:
    n = int(round(max(0.0, min(share, 1.0)) * width))
    return "█" * n + "·" * (width - n)


def _fmt_ms(x: Optional[float]) -> str:
    return wording.ms(x)


def bucket_table(p: RankAnalysis) -> Table:
    what = "CPU op" if p.steps.cpu_only else "GPU kernel"
    t = Table(title=f"{what} time per step, by bucket", title_justify="left")
    t.add_column("bucket")
    t.add_column("ms/step", justify="right")
    t.add_column("share", justify="right")
    t.add_column("")
    for b, v in sorted(p.buckets.items(), key=lambda kv: -kv[1]["ms_per_step"]):
        if v["ms_per_step"] <= 0:
            continue
        st = BUCKET_STYLE.get(b, "white")
        t.add_row(f"[{st}]{b}[/]", _fmt_ms(v["ms_per_step"]), f"{v['share']:.1%}", f"[{st}]{_bar(v['share'])}[/]")
        if v.get("exposed_ms_per_step") is not None:
            t.add_row(
                f"[dim]  exposed ({v['overlapped_share']:.0%} hidden)[/]", _fmt_ms(v["exposed_ms_per_step"]), "", ""
            )
    if p.idle_ms_per_step:
        t.add_row("[dim](GPU idle)[/]", _fmt_ms(p.idle_ms_per_step), "", "")
    return t


def where_parts(o: Op, graph: str = "CUDA graph") -> dict[str, Optional[str]]:
    """Who launched the op, in pieces (None where the trace did not record it): ``replay`` (graph-replayed:
    the launch geometry), ``captured`` (said after it: the captured graph that attributed it), ``chain`` (the CPU op chain),
    ``types``, ``dims`` (its inputs' dtypes and shapes) and ``source`` (the Python line). ``graph``: what
    the platform calls its graphs (``wording.graph_word``: HIP graph on ROCm)."""
    a = o.attribution
    replay = None
    if a.graph_replay:
        geo = f"grid {list(o.grid)} x block {list(o.block) if o.block else None}" if o.grid else ""
        replay = f"{graph.replace(' ', '-')} replay {geo}".strip()
    return {
        "replay": replay,
        "captured": f", captured in {a.captured}:" if replay is not None and a.captured else None,
        "chain": " > ".join(a.op_chain) if a.op_chain else None,
        "types": "(" + ", ".join(wording.dtype_name(t) for t in a.input_types if t) + ")" if a.input_types else None,
        "dims": " ".join(str(d) for d in a.input_dims if d) if a.input_dims else None,
        "source": f"@ {a.source}" if a.source else None,
    }


WHERE_PARTS = ("replay", "captured", "chain", "types", "dims", "source")


def op_where(o: Op, graph: str = "CUDA graph", parts: tuple[str, ...] = WHERE_PARTS) -> str:
    """One line: who launched the op, with which dtypes/shapes, from which source line (``parts`` of
    :func:`where_parts`; ``captured`` is said right after ``replay``)."""
    w = where_parts(o, graph)
    out = []
    for k in parts:
        x = w[k]
        if x is None or k == "captured":
            continue
        out.append(x + (w["captured"] or "") if k == "replay" and "captured" in parts else x)
    return "  ".join(out)


def ops_table(p: RankAnalysis, limit: int = 10) -> Table:
    t = Table(title="Dominant ops (per step)", title_justify="left")
    t.add_column("op / launched by", overflow="fold", ratio=1)
    t.add_column("bucket")
    t.add_column("ms", justify="right")
    t.add_column("share", justify="right")
    t.add_column("n", justify="right")
    for o in p.ops[:limit]:
        st = BUCKET_STYLE.get(o.bucket, "white")
        where = op_where(o, wording.graph_word(p.meta))
        name = BoundaryText(Text(term(o.short), style="bold"))
        cell = Group(name, hanging(f"[dim]  {escape(where)}[/]")) if where else name
        t.add_row(
            cell,
            f"[{st}]{o.bucket}[/]",
            _fmt_ms(o.ms_per_step),
            f"{o.share:.1%}",
            wording.per_step_count(o.count_per_step),
        )
    return t


def ranks_table(d: Diagnosis) -> Optional[Table]:
    if len(d.ranks) < 2:
        return None
    t = Table(title="Per rank", title_justify="left")
    hosts = [(r.meta or {}).get("host") for r in d.ranks]
    if len(set(hosts)) > 1:  # a several-host run: which host each rank ran on
        t.add_column("host", justify="left")
    for c in ("rank", "stage", "steps", "median ms", "copy", "gemm", "attention", "comm", "idle ms"):
        t.add_column(c, justify="right" if c not in ("stage",) else "left")
    strag = (d.straggler or {}).get("rank")
    for r, h in zip(d.ranks, hosts):
        b = r.buckets
        mark = " [red](straggler)[/]" if strag == r.rank and (d.straggler or {}).get("significant") else ""
        t.add_row(
            *([escape(h or "-")] if len(set(hosts)) > 1 else []),
            f"{r.rank if r.rank is not None else '-'}{mark}",
            escape(r.stage or ""),
            str(r.steps.count),
            _fmt_ms(r.steps.median_ms),
            *(f"{b[x]['share']:.0%}" for x in ("copy", "gemm", "attention", "communication")),
            _fmt_ms(r.idle_ms_per_step),
        )
    return t


def roofline_lines(p: RankAnalysis, top: int = 3) -> list[str]:
    """The ops furthest above their own floor: achieved TB/s and TFLOP/s against the GPU's peaks."""
    r = getattr(p, "roofline", None) or {}
    if not r.get("available"):
        return []
    rows = sorted(r["ops"], key=lambda o: -o["ms_per_step_above_floor"])[:top]
    out = [
        f"[dim]  ops against {escape(str(r['gpu']))}'s peaks ({r['peak_tb_s']} TB/s, {r['peak_bf16_tflops']:.0f} "
        f"BF16 TFLOP/s): {_fmt_ms(r['ms_per_step_above_op_floors'])} ms/step above their own floors[/]"
    ]
    for o in rows:
        tf = f", {o['achieved_tflops']:.1f} TFLOP/s" if o["flops"] else ""
        out.append(
            f"[dim]    {escape(_cut_name(str(o.get('short') or o['name'])))}: {o['achieved_tb_s']:.2f} TB/s "
            f"({o['bw_fraction_of_peak']:.0%} of peak){tf}, {o['times_its_floor']}x its floor, "
            f"+{_fmt_ms(o['ms_per_step_above_floor'])} ms/step[/]"
        )
    return out


def floor_lines(p: RankAnalysis) -> list[str]:
    """A few lines: the floor of a step on this GPU, the measured step against it, the bucket furthest
    above. Without a floor: one short hint, and only when options the user can add would give it."""
    fl = p.floor or {}
    if not fl:
        return []
    if not fl.get("available"):
        opts = fl.get("missing_options") or []
        if not opts:
            return []
        gpu = (fl.get("gpu") or {}).get("name")
        meta = {"--model-config": "CONFIG_JSON", "--batch": "N", "--context": "TOKENS"}
        add = " ".join(f"{o.split()[0]} {meta.get(o.split()[0], 'VALUE')}" for o in opts)
        return [
            f"[dim]floor (what this step should cost{' on the ' + escape(str(gpu)) if gpu else ''}): "
            f"add {escape(add)}[/]"
        ]
    g = fl.get("gpu") or {}
    i = fl.get("inputs") or {}
    b = fl.get("buckets") or {}
    w = fl.get("worst_bucket")
    rows = "  ".join(
        f"{k} {_fmt_ms(v['measured_ms'])}/{_fmt_ms(v['floor_ms'])}"
        for k, v in b.items()
        if v["measured_ms"] > 0 or v["floor_ms"] > 0
    )
    by = fl.get("bytes_per_step") or {}
    mbu = fl.get("memory_bandwidth_utilisation")
    return [
        f"[bold]floor[/] on {escape(str(g.get('name')))} ({g.get('mem_bw_tbs')} TB/s): [bold]{_fmt_ms(fl['floor_ms'])} ms[/]/step;"
        f" measured {_fmt_ms(fl['measured_ms'])} ms is [bold]{fl.get('ratio') or 0:.1f}x[/]; furthest above its floor: "
        f"[bold {BUCKET_STYLE.get(str(w), 'white')}]{w}[/] (+{_fmt_ms(fl['worst_gap_ms'])} ms)",
        f"[dim]  ms/step measured/floor: {rows}[/]",
        f"[dim]  reads {wording.nbytes(by.get('weights', 0))} weights + {wording.nbytes(by.get('kv', 0))} KV per step "
        f"(batch {i.get('batch')}, context {i.get('context')}, tp {i.get('tp_size')}, KV {i.get('kv_cache_dtype')})"
        + (f"; memory-bandwidth utilisation {mbu:.0%}" if mbu is not None else "")
        + "[/]",
    ]
