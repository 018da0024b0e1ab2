"""`perfscope report`: the breakdown of a run folder or traces as one self-contained HTML file."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from perfscope.cli import _paths

NAME = "report"
ORDER = 25
EXAMPLES = [
    ("perfscope report run1", "run1/report.html: works offline, charts inside"),
    ("perfscope report trace.json.gz -o ~/r.html", "a trace file, written where you say"),
    ("perfscope report run1 --capture-trace capture/", "CUDA-graph-replayed kernels attributed to their ops"),
]


def default_output(paths: List[Path]) -> Path:
    """RUN_DIR/report.html for a run folder; else ./<first trace's stem>.report.html."""
    first = paths[0]
    if len(paths) == 1 and first.is_dir() and (first / "run.json").is_file():
        return first / "report.html"
    from perfscope.load.discover import trace_stem

    stem = trace_stem(first.name)
    return Path.cwd() / f"{stem or 'perfscope'}.report.html"


def command(
    paths: List[Path] = typer.Argument(
        ...,
        help="A perfscope run folder (run.json + traces/), an SGLang profile folder, or trace files (.json/.json.gz).",
    ),
    output: Optional[Path] = _paths.out_option(
        "-o", "--output", help="The HTML file to write (default: RUN_DIR/report.html, or ./<trace>.report.html)."
    ),
    config: Optional[Path] = typer.Option(
        None, "--config", help="The server's config as JSON (SGLang /server_info); run folders carry it already."
    ),
    workers: Optional[int] = typer.Option(
        None, "--workers", help="Processes for several files (default: one per CPU)."
    ),
    capture_trace: Optional[List[Path]] = typer.Option(
        None,
        "--capture-trace",
        metavar="PATH",
        help="A graph-capture trace (as for diagnose): attributes CUDA-graph-replayed kernels to their CPU op, "
        "shapes and source line.",
    ),
) -> int:
    """Write one self-contained HTML report (works offline, no network): what was traced, the decode
    step time / TPOT, the top finding and the command that fixes it, GPU time per bucket for every step
    (and per rank), a zoomable timeline of one representative step, a sortable table of the top ops,
    and every finding with its evidence and predicted step time."""
    from perfscope.report.escape import Console

    from perfscope.cli._diagnosis import DiagnosisOptions, build_diagnosis
    from perfscope.report.html import write_diagnosis_html
    from perfscope.util.files import user_path

    opts = DiagnosisOptions(config=config, workers=workers, capture_trace=capture_trace)
    cfg = opts.server_config  # a bad --config is a bad option, before the output's path is resolved
    out = output or user_path(default_output(paths))
    d = build_diagnosis(paths, opts)
    write_diagnosis_html(out, d, cfg, announce=Console(stderr=True, soft_wrap=True))
    return 0
