"""The rich terminal rendering of a diagnosis."""

from __future__ import annotations

from typing import Optional

from rich.console import Console, Group
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from perfscope.analysis.gpus import device_label
from perfscope.analysis.result import Diagnosis, RankAnalysis

BUCKET_STYLE = {"copy": "red", "gemm": "blue", "attention": "magenta", "communication": "yellow",
                "moe": "cyan", "sampling": "green", "elementwise": "bright_black", "other": "white"}


def _bar(share: float, width: int = 24) -> str:
    n = int(round(max(0.0, min(share, 1.0)) * width))
    return "█" * n + "·" * (width - n)


def _fmt_ms(x: Optional[float]) -> str:
    if x is None:
        return "-"
    return f"{x:.3f}" if x < 10 else f"{x:.2f}" if x < 100 else f"{x:.1f}"


def header(d: Diagnosis) -> Panel:
    p = d.primary
    m = p.meta
    s = p.steps
    cpu = s.get("analysed_on") == "cpu-ops"
    unit = "CPU ops" if cpu else "GPU work"
    gpu = device_label(m) or ("no GPU activity" if cpu else "unknown GPU")
    lines = [
        f"[bold]{escape(str(gpu))}[/]" + (f" (sm {m['compute_capability']})" if m.get("compute_capability") else "") +
        f"  {len(d.ranks)} trace file(s)" + (f", world size {m.get('world_size')}" if m.get("world_size") else ""),
        f"steps: [bold]{s.get('count', 0)} {s.get('phase')}[/] found by {escape(str(s.get('how') or s.get('method')))}",
        f"median step ({unit}): [bold]{_fmt_ms(s.get('median_ms'))} ms[/]"
        f"   {'op' if cpu else 'kernel'} time/step {_fmt_ms(p.kernel_ms_per_step)} ms"
        f"   {'idle' if cpu else 'GPU idle'} in step {_fmt_ms(p.idle_ms_per_step)} ms",
    ]
    other = [ph for ph in p.phases if ph["phase"] != s.get("phase")]
    if other:
        lines.append("other phases: " + ", ".join(f"{ph['phase']} x{ph['count']} (median {_fmt_ms(ph['median_ms'])} ms)"
                                                  for ph in other))
    t = d.timings
    if t.get("tpot_ms"):
        how = "perfscope bench" if t["source"] == "bench" else "during the trace, under the profiler"
        lines.append(f"measured TPOT (client, {how}): [bold]{_fmt_ms(t['tpot_ms'])} ms[/]")
    return Panel("\n".join(lines), title="perfscope diagnose", expand=False)


def bucket_table(p: RankAnalysis) -> Table:
    what = "CPU op" if p.steps.get("analysed_on") == "cpu-ops" else "GPU kernel"
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
            t.add_row(f"[dim]  exposed ({v['overlapped_share']:.0%} hidden)[/]", _fmt_ms(v["exposed_ms_per_step"]),
                      "", "")
    if p.idle_ms_per_step:
        t.add_row("[dim](GPU idle)[/]", _fmt_ms(p.idle_ms_per_step), "", "")
    return t


def op_where(o: dict) -> str:
    """One line: who launched the op, with which dtypes/shapes, from which source line."""
    where = []
    if o.get("graph_replay"):
        geo = f"grid {o.get('grid')} x block {o.get('block')}" if o.get("grid") else ""
        where.append(f"CUDA-graph replay {geo}".strip() + (f", captured in {o['captured']}:" if o.get("captured") else ""))
    if o.get("op_chain"):
        where.append(" > ".join(o["op_chain"]))
    if o.get("input_types"):
        where.append("(" + ", ".join(str(t).replace("c10::", "") for t in o["input_types"] if t) + ")")
    if o.get("input_dims"):
        where.append(" ".join(str(d) for d in o["input_dims"] if d))
    if o.get("source"):
        where.append(f"@ {o['source']}")
    return "  ".join(where)


def ops_table(p: RankAnalysis, limit: int = 10) -> Table:
    t = Table(title="Dominant ops (per step)", title_justify="left")
    t.add_column("op / launched by", overflow="fold", ratio=1)
    t.add_column("bucket")
    t.add_column("ms", justify="right")
    t.add_column("share", justify="right")
    t.add_column("n", justify="right")
    for o in p.ops[:limit]:
        st = BUCKET_STYLE.get(o["bucket"], "white")
        where = op_where(o)
        cell = f"[bold]{escape(o['short'])}[/]" + (f"\n[dim]  {escape(where)}[/]" if where else "")
        t.add_row(cell, f"[{st}]{o['bucket']}[/]", _fmt_ms(o["ms_per_step"]), f"{o['share']:.1%}",
                  f"{o['count_per_step']:.0f}")
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
        t.add_row(*([escape(h or "-")] if len(set(hosts)) > 1 else []), f"{r.rank if r.rank is not None else '-'}{mark}", r.stage or "", str(r.steps.get("count")),
                  _fmt_ms(r.steps.get("median_ms")), *(f"{b[x]['share']:.0%}" for x in ("copy", "gemm", "attention", "communication")),
                  _fmt_ms(r.idle_ms_per_step))
    return t


def findings_panel(p: RankAnalysis) -> Panel:
    if not p.findings:
        return Panel("No known bottleneck matched.", title="Findings", expand=False)
    parts = []
    for f in p.findings:
        pred = f.get("predicted_step_ms_after_fix")
        head = Text.assemble((f"[{f['id']}] ", "bold red"), (f["title"], "bold"),
                             f"  {f['ms_per_step']:.2f} ms/step, {f['share']:.0%} of kernel time, confidence {f['confidence']}")
        body = Text(f["summary"])
        lines = [head, body]
        if pred is not None:
            fl = (f.get("evidence") or {}).get("floor_step_ms")
            lines.append(Text(f"predicted step after fix: {pred:.2f} ms" + (f"  (floor {fl:.2f} ms: {pred / fl:.1f}x above it)" if fl else ""), style="green"))
        if f.get("fix_command"):
            lines.append(Text.assemble(("fix: ", "bold"), (f["fix_command"], "bold green")))
        elif f.get("remedy"):
            lines.append(Text.assemble(("remedy: ", "bold"), f["remedy"]))
        ev = {k: v for k, v in f["evidence"].items() if v is not None and k not in ("kernel",)}
        lines.append(Text("evidence: " + ", ".join(f"{k}={v}" for k, v in list(ev.items())[:12]), style="dim"))
        parts.append(Group(*lines))
        parts.append(Text(""))
    return Panel(Group(*parts[:-1]), title="Findings", expand=False)


def floor_lines(p: RankAnalysis) -> list[str]:
    """A few lines: the floor of a step on this GPU, the measured step against it, the bucket furthest above."""
    fl = p.floor or {}
    if not fl:
        return []
    if not fl.get("available"):
        return [f"[dim]{escape(str(fl.get('missing') or 'floor: not computed'))}[/]"]
    g = fl.get("gpu") or {}
    i = fl.get("inputs") or {}
    b = fl.get("buckets") or {}
    w = fl.get("worst_bucket")
    rows = "  ".join(f"{k} {_fmt_ms(v['measured_ms'])}/{_fmt_ms(v['floor_ms'])}" for k, v in b.items()
                     if v["measured_ms"] > 0 or v["floor_ms"] > 0)
    by = fl.get("bytes_per_step") or {}
    mbu = fl.get("memory_bandwidth_utilisation")
    return [
        f"[bold]floor[/] on {escape(str(g.get('name')))} ({g.get('mem_bw_tbs')} TB/s): [bold]{_fmt_ms(fl['floor_ms'])} ms[/]/step;"
        f" measured {_fmt_ms(fl['measured_ms'])} ms is [bold]{fl.get('ratio') or 0:.1f}x[/]; furthest above its floor: "
        f"[bold {BUCKET_STYLE.get(w, 'white')}]{w}[/] (+{_fmt_ms(fl['worst_gap_ms'])} ms)",
        f"[dim]  ms/step measured/floor: {rows}[/]",
        f"[dim]  reads {by.get('weights', 0) / 1e9:.2f} GB weights + {by.get('kv', 0) / 1e9:.3f} GB KV per step "
        f"(batch {i.get('batch')}, context {i.get('context')}, tp {i.get('tp_size')}, KV {i.get('kv_cache_dtype')})"
        + (f"; memory-bandwidth utilisation {mbu:.0%}" if mbu is not None else "") + "[/]",
    ]


def render(d: Diagnosis, console: Optional[Console] = None, top: int = 10) -> None:
    c = console or Console()
    p = d.primary
    c.print(header(d))
    for note in p.notes:
        c.print(f"[yellow]note:[/] {escape(note)}")
    if not p.per_step and p.cpu_ops:
        t = Table(title="Top CPU ops (no GPU kernels)", title_justify="left")
        t.add_column("op")
        t.add_column("ms/step", justify="right")
        t.add_column("n/step", justify="right")
        for o in p.cpu_ops[:top]:
            t.add_row(escape(o["name"]), _fmt_ms(o["ms_per_step"]), f"{o['count_per_step']:.0f}")
        c.print(t)
        return
    c.print(bucket_table(p))
    for line in floor_lines(p):
        c.print(line)
    c.print(ops_table(p, top))
    rt = ranks_table(d)
    if rt is not None:
        c.print(rt)
        s = d.straggler or {}
        if s.get("significant"):
            c.print(f"[red]straggler:[/] rank {s['rank']} at {_fmt_ms(s['median_ms'])} ms/step, "
                    f"{s['slower_than_others']:.2f}x the other ranks' median ({s['signal']})")
    par = d.parallel or {}
    if par.get("bound") == "memory":
        c.print(f"note: {par['files']} trace files parsed {par['workers']} at a time, to fit in the memory available")
    c.print(findings_panel(p))
