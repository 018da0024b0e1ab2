"""`perfscope compare`: two traces or run folders side by side (before / after a fix)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

from perfscope.cli import _paths
from perfscope.errors import InputError, PerfscopeError

if TYPE_CHECKING:
    from perfscope.analysis.result import Diagnosis
    from perfscope.cli._diagnosis import DiagnosisOptions

NAME = "compare"
ORDER = 60
EXAMPLES = [
    ("perfscope compare run1 run2", "before / after: step time, TPOT, buckets, findings, changed ops"),
    ("perfscope compare run1 run2 --html before-after.html", "+ a self-contained HTML comparison"),
    ("perfscope compare before.json.gz after.json.gz --json", "two trace files, as JSON"),
]


def load_side(path: Path, which: str, opts: "DiagnosisOptions") -> "Diagnosis":
    """Diagnose one side; its errors say which side (``before: x.json.gz: not a Kineto trace``)."""
    from perfscope.cli._diagnosis import build_diagnosis

    try:
        return build_diagnosis([path], opts)
    except PerfscopeError as e:
        msg = str(e)
        raise type(e)(f"{which}: {msg}" if str(path) in msg else f"{which} ({path}): {msg}") from None
    except (OSError, ValueError) as e:  # anything the loader did not already turn into a message
        raise InputError(f"{which} ({path}): unreadable ({e})") from None


def label_of(path: Path) -> str:
    from perfscope.load.discover import trace_stem

    return trace_stem(path.name or str(path)) or str(path)


def command(
    before: Path = typer.Argument(..., help="The baseline: a trace file, profile folder or perfscope run folder."),
    after: Path = typer.Argument(..., help="The run to compare with it (after the fix)."),
    html: Optional[Path] = _paths.out_option("--html", help="Also write a self-contained HTML report here."),
    json_out: bool = typer.Option(False, "--json", help="Print the comparison as one JSON object on stdout."),
    config_before: Optional[Path] = typer.Option(None, "--config-before", help="Server config JSON of BEFORE."),
    config_after: Optional[Path] = typer.Option(None, "--config-after", help="Server config JSON of AFTER."),
    top: int = typer.Option(10, "--top", help="How many changed ops to list."),
    workers: Optional[int] = typer.Option(None, "--workers", help="Processes per side for several files."),
) -> int:
    """Compare two traces or run folders: decode step time and TPOT before/after with the ratio, GPU
    time per bucket (ms and share) and its deltas, findings that disappeared or appeared, and the top
    ops that changed. Comparing different setups (GPU, model, world size) is allowed and flagged."""
    from perfscope.report.escape import Console

    from perfscope.analysis.compare import compare
    from perfscope.cli._diagnosis import DiagnosisOptions
    from perfscope.report import compare_terminal, jsonout

    ob = DiagnosisOptions(config=config_before, workers=workers)
    oa = DiagnosisOptions(config=config_after, workers=workers)
    cb, ca = ob.server_config, oa.server_config
    for p, which in ((before, "before"), (after, "after")):
        if not p.exists():
            raise InputError(f"{which} ({p}): no such file or folder")
    db = load_side(before, "before", ob)
    da = load_side(after, "after", oa)
    la, lb = label_of(after), label_of(before)
    if la == lb:
        la, lb = f"{la} (after)", f"{lb} (before)"
    from perfscope.bench.store import tpot_samples

    def samples_of(p: Path, d: "Diagnosis") -> Optional[list]:
        return tpot_samples(p) if p.is_dir() and d.timings.get("source") == "bench" else None

    samples = (samples_of(before, db), samples_of(after, da))
    c = compare(db, da, labels=(lb, la), configs=(cb, ca), top_ops=max(top, 15), tpot_samples=samples)
    if html is not None:
        from perfscope.report.html import render_compare, write_html

        path = write_html(html, render_compare(c, db, da))
        say = Console(stderr=True, highlight=False, soft_wrap=True)  # the path is never folded
        say.print(f"report written: {path} ({path.stat().st_size / 1e6:.1f} MB)", markup=False)
    if json_out:
        jsonout.emit(c)
    else:
        compare_terminal.render(c, Console(), top=top)
    return 0
