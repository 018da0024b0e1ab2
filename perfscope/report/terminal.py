"""The rich terminal rendering of a diagnosis: the verdict, the facts, every finding in full, and the
tables of perfscope.report.terminal_tables."""

from __future__ import annotations

from typing import Optional

from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from perfscope.analysis.finding import Finding
from perfscope.analysis.gpus import device_label
from perfscope.analysis.result import Diagnosis
from perfscope.report import wording
from perfscope.report.escape import Console, markup as escape, term
from perfscope.report.terminal_tables import _fmt_ms, bucket_table, floor_lines, ops_table, ranks_table, roofline_lines
from perfscope.report.textfit import fit_title as _fit_title, hanging
from perfscope.report.view import view


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def share_of(f: Finding, cpu: bool = False) -> str:
    """What a finding's share is of; a CPU-only trace has CPU op time where GPUs have kernel time."""
    what = f.share_of or "kernel time"
    return "CPU op time" if cpu and what == "kernel time" else what


def verdict(d: Diagnosis, width: Optional[int] = None) -> Panel:
    """The first screen: the top finding, what it costs, the command that fixes it and the step time
    predicted after it; or, when no rule matched, what was analysed and what the rules cover.

    A fix command wider than the panel can hold (``width``: the console's) is not folded inside it,
    where a copied command would carry the fold: the panel says so and :func:`long_fix_command`
    gives the line to print, unwrapped, right below it."""
    p = d.primary
    s = p.steps
    cpu = s.cpu_only
    gpu = device_label(p.meta) or ("CPU (no GPU activity)" if cpu else "unknown GPU")
    step_ms = s.median_ms
    files = f" · {_plural(len(d.ranks), 'trace')}" if len(d.ranks) > 1 else ""
    steps = _plural(s.count, f"{s.phase} step")
    title, rest = _fit_title(["perfscope diagnose", f"{gpu}{files}", steps, f"median {_fmt_ms(step_ms)} ms"], width)
    head = [f"[dim]{escape(rest)}[/]"] if rest else []
    if not p.findings:
        from perfscope.analysis.rules import RULES

        ran = [r for r in RULES if not cpu or not r.needs_gpu_timeline]
        skipped = "" if len(ran) == len(RULES) else f"; the {len(RULES) - len(ran)} idle-time rules need a GPU timeline"
        body = head + [
            f"[bold green]No known bottleneck matched[/] in the {steps} analysed "
            f"({'their CPU ops: the trace has no GPU kernels' if cpu else 'their GPU kernels'}).",
            f"[dim]The {len(ran)} rules checked look for: {', '.join(r.id for r in ran)}{skipped} "
            f"(what each means: perfscope rules).[/]",
        ]
        return Panel(
            Group(*(hanging(x, labels=True) for x in body)), title=escape(title), title_align="left", expand=False
        )
    top = view(d).top
    assert top is not None  # p.findings is not empty
    f = top.finding
    body = head + [
        f"[bold red]{escape(f.id)}[/]  [bold]{escape(f.title)}[/]",
        f"costs [bold]{_fmt_ms(f.ms_per_step)} ms[/] per step ({wording.pct(f.share)} of {share_of(f, cpu)}), "
        f"confidence {f.confidence}",
    ]
    fc = top.fix
    if fc is not None:
        if _fits(fc.check, width):
            body.append(f"fix:   [bold green]{escape(fc.check)}[/]")
        else:
            body.append("fix:   [bold]the command under this box[/] [dim](one line, as long as it is)[/]")
        body.append("[dim]       (shows the diff, changes nothing; then add --apply)[/]")
        if fc.where_short:
            body.append(f"[dim]       ({escape(fc.where_short)})[/]")
    elif f.remedy:
        body.append(f"remedy: {escape(f.remedy)}")
    pred, pr = f.predicted_step_ms_after_fix, top.prediction
    if pred is not None and pred <= 0:  # a step of nothing is no prediction (the finding's time >= the step)
        body.append("[dim]after: no prediction (the finding's time is the whole measured step)[/]")
    elif pr is not None and pr.speedup:
        speed = f" ({pr.speedup:.1f}x faster)" if pr.speedup >= 1.05 else ""
        rng = f" ({wording.ms_range((pr.low, pr.high))})" if pr.ranged else ""
        body.append(
            f"after: [bold green]~{_fmt_ms(pr.step_ms)} ms[/] per step predicted{rng}, "
            f"from {_fmt_ms(pr.from_ms)} ms{speed}"
        )
        if pr.basis and pr.bound == "host":
            body.append(f"[dim]       ({pr.basis})[/]")  # host-bound: what the point is made of
        if pr.saving:
            body.append(f"[dim]       ({escape(pr.saving)})[/]")
    if len(p.findings) > 1:
        body.append(
            "[dim]also: " + ", ".join(f"{escape(x.id)} ({_fmt_ms(x.ms_per_step)} ms)" for x in p.findings[1:]) + "[/]"
        )
    # a line that wraps keeps its indent (the fix's notes under "fix:", the prediction under "after:")
    return Panel(Group(*(hanging(x, labels=True) for x in body)), title=escape(title), title_align="left", expand=False)


# the panel's frame and padding, and the "fix:   " label before the command
_PANEL_CHROME = 4 + len("fix:   ")


def _fits(cmd: str, width: Optional[int]) -> bool:
    return width is None or len(cmd) + _PANEL_CHROME <= width


def long_finding_commands(d: Diagnosis, width: Optional[int]) -> list[tuple[str, str]]:
    """(finding id, fix command) for each finding whose command :func:`findings_panel` leaves out."""
    return [
        (fv.finding.id, fv.fix.check)
        for fv in view(d).findings
        if fv.fix is not None and not _fits(fv.fix.check, width)
    ]


def long_fix_command(d: Diagnosis, width: Optional[int]) -> Optional[str]:
    """The top finding's fix command when it is too wide for the verdict panel at ``width`` columns
    (printed under the panel as one unwrapped line, so that it pastes as it is), else None."""
    top = view(d).top
    if width is None or top is None or top.fix is None or _fits(top.fix.check, width):
        return None
    return top.fix.check


def facts(d: Diagnosis) -> list[str]:
    """Two or three short lines under the verdict: how the steps were found, kernel vs idle time,
    other phases, the measured TPOT."""
    p = d.primary
    m = p.meta
    s = p.steps
    cpu = s.cpu_only
    arch = wording.gpu_arch(m)
    arch = f" ({arch})" if arch else ""
    ws = f", world size {m.get('world_size')}" if m.get("world_size") else ""
    lines = [
        f"[dim]{escape(str(device_label(m) or ('CPU' if cpu else 'unknown GPU')))}{arch}{ws}; steps found by "
        f"{escape(str(s.how or s.method))}[/]",
        f"[dim]per step: {'op' if cpu else 'kernel'} time {_fmt_ms(p.kernel_ms_per_step)} ms, "
        f"{'idle' if cpu else 'GPU idle'} {_fmt_ms(p.idle_ms_per_step)} ms[/]",
    ]
    other = [ph for ph in p.phases if ph["phase"] != s.phase]
    if other:
        lines[-1] = (
            lines[-1][:-3]
            + "; other phases: "
            + ", ".join(f"{escape(ph['phase'])} x{ph['count']} (median {_fmt_ms(ph['median_ms'])} ms)" for ph in other)
            + "[/]"
        )
    t = d.timings
    if t.get("tpot_ms"):
        how = "perfscope bench" if t["source"] == "bench" else "during the trace, under the profiler"
        lines.append(f"measured TPOT (client, {how}): [bold]{_fmt_ms(t['tpot_ms'])} ms[/]")
    return lines


def header(d: Diagnosis) -> Panel:
    """(kept for callers of the old layout) the verdict panel."""
    return verdict(d)


def findings_panel(d: Diagnosis, width: Optional[int] = None) -> Optional[Panel]:
    """Every finding in full: what it costs, why (its summary), the prediction, the fix, the evidence.
    A fix command too wide for the panel at ``width`` columns is named there and printed under it
    (:func:`long_finding_commands`), never folded."""
    p = d.primary
    cpu = p.steps.cpu_only
    if not p.findings:
        return None
    parts: list[Group | Text] = []
    for fv in view(d).findings:
        f, pr, fc = fv.finding, fv.prediction, fv.fix
        head = Text.assemble(
            (f"[{term(f.id)}] ", "bold red"),
            (term(f.title), "bold"),
            f"  {_fmt_ms(f.ms_per_step)} ms/step, {wording.pct(f.share)} of {share_of(f, cpu)}, "
            f"confidence {f.confidence}",
        )
        lines = [head, Text(term(f.summary))]
        if pr is not None:
            fl = (f.evidence or {}).get("floor_step_ms")
            rng = f"; range {_fmt_ms(pr.low)}-{_fmt_ms(pr.high)} ms" if pr.ranged else ""
            lines.append(
                Text(
                    f"predicted step after fix: {_fmt_ms(pr.step_ms)} ms"
                    + {"host": f" (bound by the host{rng})", "gpu": f" (bound by GPU work{rng})"}.get(str(pr.bound), "")
                    + (f"  (floor {_fmt_ms(fl)} ms: {pr.step_ms / fl:.1f}x above it)" if fl else ""),
                    style="green",
                )
            )
        if fc is not None and _fits(fc.check, width):
            lines.append(
                Text.assemble(
                    ("fix: ", "bold"), (term(fc.check), "bold green"), ("  (check + diff; then add --apply)", "dim")
                )
            )
        elif fc is not None:
            lines.append(
                Text.assemble(
                    ("fix: ", "bold"),
                    ("under this box, one line", "bold"),
                    ("  (check + diff; then add --apply)", "dim"),
                )
            )
        if f.remedy and fc is None:
            lines.append(Text.assemble(("remedy: ", "bold"), term(f.remedy)))
        ev = {k: v for k, v in (f.evidence or {}).items() if k != "floor_step_ms"}
        items = wording.evidence_items(ev)
        if items:
            lines.append(Text("evidence: " + " · ".join(term(i) for i in items), style="dim"))
        parts.append(Group(*lines))
        parts.append(Text(""))
    return Panel(Group(*parts[:-1]), title="Findings", title_align="left", expand=False)


def render(d: Diagnosis, console: Optional[Console] = None, top: int = 10) -> None:
    """Verdict first (the top finding, its cost, the fix command, the predicted step: the first
    screen), then the buckets, the floor, the ops, the ranks, and every finding in full."""
    c = console or Console()
    p = d.primary
    c.print(verdict(d, c.width))
    long_cmd = long_fix_command(d, c.width)
    if long_cmd is not None:
        # no folding, no markup: the terminal wraps it on screen, a copy is the command itself
        c.print(Text(term(long_cmd), style="bold green"), soft_wrap=True, overflow="ignore", crop=False)
    for line in facts(d):
        c.print(line)
    for note in p.notes:
        c.print(f"[yellow]note:[/] {escape(note)}")
    skipped = wording.skipped_note(d.skipped)
    if skipped:
        c.print(f"[yellow]note:[/] {escape(skipped)}")
    if not p.per_step and p.cpu_ops:
        t = Table(title="Top CPU ops (no GPU kernels)", title_justify="left")
        t.add_column("op")
        t.add_column("ms/step", justify="right")
        t.add_column("n/step", justify="right")
        for o in p.cpu_ops[:top]:
            t.add_row(escape(o["name"]), _fmt_ms(o["ms_per_step"]), wording.per_step_count(o["count_per_step"]))
        c.print(t)
    else:
        c.print(bucket_table(p))
        for line in floor_lines(p) + roofline_lines(p):
            c.print(hanging(line))
        c.print(ops_table(p, top))
    rt = ranks_table(d)
    if rt is not None:
        c.print(rt)
        s = d.straggler or {}
        if s.get("significant"):
            # the line compares like with like: step time with step time, or compute with compute
            c.print(
                f"[red]straggler:[/] {escape(s['line'])}"
                if s.get("line")
                else f"[red]straggler:[/] rank {s['rank']} at {_fmt_ms(s['median_ms'])} ms/step, "
                f"{s['slower_than_others']:.2f}x the other ranks' median ({s['signal']})"
            )
    par = d.parallel or {}
    if par.get("bound") == "memory":
        c.print(f"note: {par['files']} trace files parsed {par['workers']} at a time, to fit in the memory available")
    fp = findings_panel(d, c.width)
    if fp is not None:
        c.print(fp)
        for fid, cmd in long_finding_commands(d, c.width):
            c.print(
                Text.assemble((f"fix [{term(fid)}]: ", "bold"), (term(cmd), "bold green")),
                soft_wrap=True,
                overflow="ignore",
                crop=False,
            )
