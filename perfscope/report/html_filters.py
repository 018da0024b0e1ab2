"""What the HTML report's templates print (their jinja2 filters and helpers): milliseconds, shares and
signed changes, the ops table's columns, code spans, evidence values, and the compare page's text lines."""

from __future__ import annotations

from typing import Any, Optional

from perfscope.analysis.ops import Op
from perfscope.report.terminal_tables import _fmt_ms, op_where


def fmt_ms(x: Optional[float]) -> str:
    return _fmt_ms(x)


def pct(x: Optional[float], nd: int = 1) -> str:
    return "-" if x is None else f"{x * 100:.{nd}f}%"


def signed_ms(x: Optional[float]) -> str:
    if x is None:
        return "-"
    if abs(x) < 0.0005:
        return "0"
    return ("+" if x > 0 else "\u2212" if x < 0 else "") + _fmt_ms(abs(x))


def signed_pct(x: Optional[float]) -> str:
    if x is None:
        return "-"
    return ("+" if x > 0 else "\u2212" if x < 0 else "") + f"{abs(x) * 100:.1f} pp"


def op_columns(o: Op, graph: str = "CUDA graph") -> dict:
    """The ops table's text columns, from terminal_tables.op_where on the relevant part of the op
    (``graph``: HIP graph on ROCm)."""
    a = o.attribution
    return {
        "launched_by": op_where(o, graph, ("replay", "chain")) or (a.launcher or ""),
        "dtype_shape": op_where(o, graph, ("types", "dims")),
        # the same as pieces that must not break across lines: the dtypes, then each shape
        "dtype_shape_parts": ([op_where(o, graph, ("types",))] if a.input_types else [])
        + [str(d) for d in (a.input_dims or []) if d],
        "source": a.source or "",
        "geometry": (f"grid {list(o.grid)} x block {list(o.block) if o.block else None}" if o.grid else ""),
    }


def code_spans(text: Any):
    """``text`` escaped, its Markdown code spans (`x`) as <code> (the rules write their summaries
    and remedies for the terminal and Markdown too): no raw backticks on the page."""
    import re

    from markupsafe import Markup, escape

    return Markup(re.sub(r"`([^`\n]+)`", r"<code>\1</code>", str(escape("" if text is None else text))))


def plain_lines(c: dict) -> dict:
    """What the terminal's compare header says beyond the numbers, as plain text: the noise of each
    side and the change's verdict, the machine check, predicted vs measured per finding."""
    from rich.text import Text

    from perfscope.analysis.change import describe
    from perfscope.report.compare_terminal import moved_line, prediction_line

    noise = [
        describe(ch, what)
        for key, what in (("step", "step median"), ("tpot", "TPOT median"))
        if (ch := (c.get("change") or {}).get(key))
    ]
    return {
        "noise": noise,
        "moved": moved_line(c["moved_together"]) if c.get("moved_together") else None,
        "predictions": [Text.from_markup(prediction_line(pr)).plain for pr in c.get("predictions") or []],
    }


def op_table_columns(ops: list[Op]) -> dict:
    """Which optional columns of the ops table have anything to show (graph traces have no shapes)."""
    cols = [op_columns(o) for o in ops]
    return {k: any(c[k] for c in cols) for k in ("launched_by", "dtype_shape", "source")}


def evidence_value(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:,.4g}" if abs(v) < 1e6 else f"{v:,.0f}"
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(str(x) for x in v) + "]"
    s = str(v)
    return s if len(s) <= 160 else s[:157] + "..."
