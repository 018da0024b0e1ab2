"""The rich terminal rendering of a comparison (``perfscope compare``)."""

from __future__ import annotations

from typing import Optional

from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from perfscope.analysis.change import describe as describe_change
from perfscope.report.escape import Console, markup as escape, term
from perfscope.report.terminal_tables import BUCKET_STYLE, _fmt_ms
from perfscope.report.textfit import BoundaryText
from perfscope.report.wording import per_step_count as _count


def moved_line(m: dict) -> str:
    """What ``moved_together`` says: which ops moved, how far, why it matters."""
    return (
        f"{m['ops']} of {m['of_ops']} ops the fix was not expected to change moved together, "
        f"{m['median_factor']:.2f}x {m['direction']} per launch ({m['share_of_time']:.0%} of their time; e.g. "
        f"{', '.join(m['examples'])}): the machine's load or clocks changed, and the step's change is not all "
        "the fix's"
    )


def _signed(x: Optional[float]) -> str:
    if x is None:
        return "-"
    if abs(x) < 0.0005:
        return "0"
    s = "+" if x > 0 else "-" if x < 0 else ""
    colour = "red" if x > 0 else "green" if x < 0 else "white"
    return f"[{colour}]{s}{_fmt_ms(abs(x))}[/]"


def prediction_line(pr: dict) -> str:
    """``predicted by fp8-kv-cast: step 6.42 ms, measured 7.93 ms (error -19.0%)``, + TPOT when known."""
    tpot = pr.get("predicted_tpot_ms") == pr.get("predicted_step_ms") and pr.get("measured_tpot_ms") is not None
    if tpot:  # a prediction of the unprofiled TPOT, held to AFTER's bench
        line = (
            f"predicted by [bold]{escape(pr['finding'])}[/] (before run): TPOT {_fmt_ms(pr['predicted_step_ms'])} ms, "
            f"measured without the profiler [bold]{_fmt_ms(pr['measured_tpot_ms'])} ms[/] "
            f"(error {pr['error_pct']:+.1f}%; the profiled step {_fmt_ms(pr['measured_step_ms'])} ms)"
        )
    else:
        line = (
            f"predicted by [bold]{escape(pr['finding'])}[/] (before run): step {_fmt_ms(pr['predicted_step_ms'])} ms, "
            f"measured [bold]{_fmt_ms(pr['measured_step_ms'])} ms[/] (error {pr['error_pct']:+.1f}%)"
            + (
                " [dim](under the profiler; the prediction is of the unprofiled step)[/]"
                if pr.get("measured_under_profiler")
                else ""
            )
        )
    if pr.get("bound") == "host":
        line += " [dim](host-bound)[/]"
    if pr.get("predicted_range_ms") and pr["predicted_range_ms"][0] != pr["predicted_range_ms"][1]:
        lo, hi = pr["predicted_range_ms"]
        line += (
            f"; range {_fmt_ms(lo)}-{_fmt_ms(hi)} ms "
            f"({'measured inside' if pr['within_range'] else 'measured outside'})"
        )
    d = pr.get("unchanged_kernels_delta_ms")
    if d is not None and pr.get("measured_step_ms") and abs(d) >= 0.02 * pr["measured_step_ms"]:
        top = (pr.get("unchanged_kernels_largest") or [{}])[0]
        line += (
            f"; kernels it assumed unchanged moved {d:+.2f} ms/step (largest {escape(str(top.get('short')))} "
            f"{top.get('delta_ms', 0):+.2f})"
        )
        if pr.get("error_with_measured_kernels_pct") is not None:
            e, e0 = pr["error_with_measured_kernels_pct"], pr["error_pct"]
            line += f": with their measured times the error is {e:+.1f}%"
            if abs(e) > abs(e0):
                line += (
                    f" (larger than {e0:+.1f}%: the kernels' move had offset part of the step model's own "
                    "error, which this shows alone)"
                )
    if pr.get("host_work_added"):
        hb, ha = pr["host_step_ms"]
        line += f"; the fix added host work: the CPU step took {_fmt_ms(hb)} ms before, {_fmt_ms(ha)} ms after"
    if tpot:
        pass  # said above
    elif pr.get("predicted_tpot_ms") is not None:
        line += (
            f"; TPOT {_fmt_ms(pr['predicted_tpot_ms'])} ms predicted, {_fmt_ms(pr['measured_tpot_ms'])} ms "
            f"measured (error {pr['tpot_error_pct']:+.1f}%)"
        )
    return line


def cpu_only(c: dict) -> bool:
    """Both sides analysed on CPU ops (CPU-only traces, e.g. the demo's): say CPU, not GPU."""
    return all(c[k].get("analysed_on") == "cpu-ops" for k in ("before", "after"))


def _device(side: dict) -> str:
    return str(side.get("device_label") or side.get("device") or "unknown device")


def _labelled(label: str, rest: str, style: str = "") -> Table:
    """``label`` then ``rest`` (markup), whose wrapped lines stay under ``rest``, not at the edge."""
    g = Table.grid(padding=0)
    g.add_column(width=len(label), no_wrap=True, style=style)
    g.add_column()
    g.add_row(label.rstrip(), rest)
    return g


def header(c: dict) -> Panel:
    b, a, st = c["before"], c["after"], c["step"]
    lines: list = [f"[bold]{escape(c['verdict'])}[/]", ""]
    lines.append(
        _labelled(
            "before: ",
            f"{escape(b['label'])}  ({escape(_device(b))}, {b['ranks']} file(s), "
            f"{b.get('step_count')} {b.get('phase')} steps)",
        )
    )
    lines.append(
        _labelled(
            "after:  ",
            f"{escape(a['label'])}  ({escape(_device(a))}, {a['ranks']} file(s), "
            f"{a.get('step_count')} {a.get('phase')} steps)",
        )
    )
    ratio = f"   after/before {st['ratio']:.3f}" if st.get("ratio") is not None else ""
    lines.append(
        f"median step ({'CPU ops' if cpu_only(c) else 'GPU work'}): [bold]{_fmt_ms(st['before_ms'])} -> {_fmt_ms(st['after_ms'])} ms[/]{ratio}"
    )
    if c.get("tpot"):
        t = c["tpot"]
        r = f"   ratio {t['ratio']:.3f}" if t.get("ratio") is not None else ""
        lines.append(f"TPOT (client): [bold]{_fmt_ms(t['before_ms'])} -> {_fmt_ms(t['after_ms'])} ms[/]{r}")
    for key, what in (("step", "step median"), ("tpot", "TPOT median")):
        ch = (c.get("change") or {}).get(key)
        if ch:
            lines.append(_labelled("noise: ", escape(describe_change(ch, what)), style="dim"))
    if c.get("moved_together"):
        lines.append(f"[bold yellow]the machine changed between runs?[/] {escape(moved_line(c['moved_together']))}")
    for pr in c.get("predictions") or []:
        lines.append(prediction_line(pr))
    if c["setup"]["differs"]:
        lines.append("[bold yellow]setups differ:[/] " + escape("; ".join(c["setup"]["warnings"])))
    elif c["setup"]["warnings"]:
        lines.append("[yellow]note:[/] " + escape("; ".join(c["setup"]["warnings"])))
    for row in c["setup"]["config"] + c["setup"]["versions"]:
        lines.append(f"[dim]{escape(row['field'])}: {escape(str(row['before']))} -> {escape(str(row['after']))}[/]")
    return Panel(Group(*lines), title="perfscope compare", expand=False)


def bucket_table(c: dict) -> Table:
    cpu = cpu_only(c)
    t = Table(title=f"{'CPU op' if cpu else 'GPU'} time per step by bucket", title_justify="left")
    for col in ("bucket", "before ms", "after ms", "delta ms", "before share", "after share"):
        t.add_column(col, justify="left" if col == "bucket" else "right")
    for r in c["buckets"]:
        st = BUCKET_STYLE.get(r["bucket"], "white")
        t.add_row(
            f"[{st}]{r['bucket']}[/]",
            _fmt_ms(r["before_ms"]),
            _fmt_ms(r["after_ms"]),
            _signed(r["delta_ms"]),
            f"{r['before_share']:.1%}",
            f"{r['after_share']:.1%}",
        )
        if "delta_exposed_ms" in r:
            t.add_row(
                "[dim]  exposed[/]",
                _fmt_ms(r["before_exposed_ms"]),
                _fmt_ms(r["after_exposed_ms"]),
                _signed(r["delta_exposed_ms"]),
                "",
                "",
            )
    i = c["idle"]
    t.add_row(
        f"[dim]({'idle' if cpu else 'GPU idle'})[/]",
        _fmt_ms(i["before_ms"]),
        _fmt_ms(i["after_ms"]),
        _signed(i["delta_ms"]),
        "",
        "",
    )
    return t


def findings_table(c: dict) -> Optional[Table]:
    f = c["findings"]
    if not (f["gone"] or f["new"] or f["kept"]):
        return None
    t = Table(title="Findings", title_justify="left")
    t.add_column("finding")
    t.add_column("status")
    t.add_column("ms/step before -> after", justify="right")
    for x in f["gone"]:
        t.add_row(escape(x["id"]), "[green]gone[/]", f"{_fmt_ms(x['ms_per_step'])} -> -")
    for x in f["new"]:
        t.add_row(escape(x["id"]), "[red]appeared[/]", f"- -> {_fmt_ms(x['ms_per_step'])}")
    for x in f["kept"]:
        t.add_row(escape(x["id"]), "still there", f"{_fmt_ms(x['before_ms'])} -> {_fmt_ms(x['after_ms'])}")
    return t


def ops_table(c: dict, limit: int = 10) -> Table:
    t = Table(title="Top ops that changed (per step)", title_justify="left")
    t.add_column("op", overflow="fold", min_width=12, ratio=1)  # 24 pushed n/step off an 80-column screen
    t.add_column("bucket")
    t.add_column("before ms", justify="right")
    t.add_column("after ms", justify="right")
    t.add_column("delta ms", justify="right")
    t.add_column("n/step", justify="right")
    for o in c["ops"][:limit]:
        st = BUCKET_STYLE.get(o["bucket"], "white")
        name = BoundaryText(
            Text.assemble(
                term(o["short"]),
                (" (gone)" if o["status"] == "gone" else " (new)" if o["status"] == "new" else "", "dim"),
            )
        )
        n = f"{_count(o['before_count'])} -> {_count(o['after_count'])}"
        t.add_row(
            name, f"[{st}]{o['bucket']}[/]", _fmt_ms(o["before_ms"]), _fmt_ms(o["after_ms"]), _signed(o["delta_ms"]), n
        )
    return t


def render(c: dict, console: Optional[Console] = None, top: int = 10) -> None:
    con = console or Console()
    con.print(header(c))
    con.print(bucket_table(c))
    ft = findings_table(c)
    if ft is not None:
        con.print(ft)
    con.print(ops_table(c, top))
