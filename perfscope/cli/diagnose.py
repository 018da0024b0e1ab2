"""`perfscope diagnose`: where each decode step's time goes, and what to do about it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, List, Optional

import typer

from perfscope.cli import _help, _paths
from perfscope.errors import GateFailed, InputError

if TYPE_CHECKING:
    from perfscope.analysis.finding import Finding
    from perfscope.report.escape import Console

NAME = "diagnose"
ORDER = 20
EXAMPLES = [
    ("perfscope diagnose run1", "a run folder of perfscope trace (or trace files, or an SGLang profile folder)"),
    ("perfscope diagnose run1 --json --fail-on fp8-kv-cast", "CI gate: exit 1 when that finding is present"),
    (
        "perfscope diagnose run1 --model-config config.json --html r.html --markdown r.md",
        "+ the hardware floor, an HTML report and a Markdown summary for an issue or PR",
    ),
    (
        "perfscope diagnose /data/prof --ray",
        "on the Ray cluster this machine is part of: each rank analysed on the node that holds its file "
        "(--ray HOST:6379 names another cluster; pip install 'perfscope[ray]')",
    ),
]

_ADDRESS = re.compile(r"^(auto|ray://.+|[\w.\-]+:\d+|\[[0-9a-fA-F:.]+\]:\d+)$")


class HELP_CLASS(_help.Command):
    """``--ray`` takes an optional address: ``--ray`` last, before another option or before a trace
    path (anything but a Ray address) is ``--ray=auto``, the cluster this machine is part of."""

    def parse_args(self, ctx, args):
        args = list(args)
        for i, a in enumerate(args):
            if a == "--":
                break
            if a == "--ray" and (i + 1 == len(args) or not _ADDRESS.match(args[i + 1])):
                args[i] = "--ray=auto"
        return super().parse_args(ctx, args)


def fail_on_ids(fail_on: Optional[str]) -> set[str]:
    """The finding ids of ``--fail-on`` (comma-separated, or 'any'), each checked against the rule
    registry: a misspelt id would otherwise never match and silently pass a CI gate (InputError,
    exit 2, naming the known ids)."""
    from difflib import get_close_matches

    from perfscope.analysis.rules import rule_ids

    if fail_on is None:
        return set()
    wanted = {x.strip() for x in fail_on.split(",") if x.strip()}
    if not wanted:
        raise InputError(f"--fail-on {fail_on!r}: no finding id given; known: any, {', '.join(rule_ids())}")
    known = set(rule_ids()) | {"any"}
    bad = sorted(wanted - known)
    if bad:
        near = get_close_matches(bad[0], sorted(known), n=1)
        raise InputError(
            f"--fail-on: unknown finding id{'s' if len(bad) > 1 else ''} {', '.join(bad)}"
            + (f" (did you mean {near[0]}?)" if near else "")
            + f"; known: any, {', '.join(rule_ids())} (perfscope rules)"
        )
    return wanted


def gate(findings: list[Finding], fail_on: Optional[str]) -> None:
    """Raise GateFailed (exit 1) when a finding named in ``fail_on`` (or any, with 'any') was found."""
    wanted = fail_on_ids(fail_on)
    if not wanted:
        return
    hit = [f.id for f in findings if "any" in wanted or f.id in wanted]
    if hit:
        raise GateFailed(f"gated finding(s) present: {', '.join(sorted(set(hit)))}")


def _stderr() -> Console:
    """stderr as a rich console: paths it names are never folded (a copy pastes back)."""
    from perfscope.report.escape import Console

    return Console(stderr=True, soft_wrap=True)


def command(
    paths: List[Path] = typer.Argument(
        ...,
        help="Trace files (.json/.json.gz), SGLang profile folders (one file "
        "per rank) or perfscope run folders (run.json + traces/).",
    ),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object on stdout instead of tables."),
    config: Optional[Path] = typer.Option(
        None, "--config", help="The server's config as JSON (SGLang /server_info); run folders carry it already."
    ),
    fail_on: Optional[str] = typer.Option(
        None,
        "--fail-on",
        metavar="IDS",
        help="Exit 1 when one of these finding ids (comma-separated, or 'any') is found: gate a CI job on it.",
    ),
    top: int = typer.Option(10, "--top", min=1, help="How many ops to list."),
    workers: Optional[int] = typer.Option(
        None, "--workers", help="Processes for several files (default: one per CPU)."
    ),
    model_config: Optional[Path] = typer.Option(
        None,
        "--model-config",
        metavar="CONFIG_JSON",
        help="The model's Hugging Face config.json: gives the floor (what a "
        "decode step should cost on this GPU) and the gap per bucket.",
    ),
    batch: Optional[int] = typer.Option(
        None, "--batch", help="Requests per decode step, for the floor (default: SGLang's step[DECODE bs=N] labels)."
    ),
    context: Optional[int] = typer.Option(None, "--context", help="Tokens each request attends, for the floor."),
    server_log: Optional[Path] = typer.Option(
        None,
        "--server-log",
        metavar="FILE",
        help="The server's log (its last 32 MiB): SGLang's MoE kernel config "
        "lines decide the untuned-fused-moe finding.",
    ),
    capture_trace: Optional[List[Path]] = typer.Option(
        None,
        "--capture-trace",
        metavar="PATH",
        help="A graph-capture trace (SGLang --enable-profile-cuda-graph; a file or a folder, repeatable): "
        "attributes CUDA-graph-replayed kernels to the CPU op, shapes and source line recorded at capture.",
    ),
    html: Optional[Path] = _paths.out_option(
        "--html", help="Also write a self-contained HTML report (offline, charts inside) to this file."
    ),
    markdown: Optional[Path] = _paths.out_option(
        "--markdown",
        metavar="FILE",
        help="Also write the summary to paste into an issue or PR "
        "(verdict, bucket table, top ops, findings) as Markdown.",
    ),
    csv_dir: Optional[Path] = _paths.out_option(
        "--csv",
        metavar="DIR",
        help="Also write the bucket and op tables (and the per-rank table) as CSV files into this folder.",
    ),
    ray: Optional[str] = typer.Option(
        None,
        "--ray",
        metavar="[ADDRESS]",
        help="Analyse each rank on the Ray node that holds its trace file and bring "
        "back only the results (the paths are read on the nodes). ADDRESS: the "
        "cluster's (HOST:PORT, ray://HOST:PORT); alone: the cluster this "
        "machine is part of. Needs pip install 'perfscope\\[ray]'.",
    ),
) -> int:
    """Parse traces fast and show where each decode step's time goes: steps and their median time,
    GPU kernel time per bucket (copy / gemm / attention / communication / ...), the dominant ops with
    their launching op, shapes and source line, per-rank tables, and findings matched to known
    bottlenecks with the fix that addresses each and the predicted step time once fixed.

    Exit codes: 0 ok, 1 a --fail-on finding was found, 2 unusable input."""
    from perfscope.cli._diagnosis import DiagnosisOptions, build_diagnosis

    fail_on_ids(fail_on)  # before reading anything: a bad gate is a bad option
    if csv_dir is not None and csv_dir.exists() and not csv_dir.is_dir():
        raise InputError(f"--csv {csv_dir}: exists and is not a folder")
    err = None if json_out else _stderr()  # --json alone never loads rich
    opts = DiagnosisOptions(
        config=config,
        model_config=model_config,
        batch=batch,
        context=context,
        server_log=server_log,
        capture_trace=capture_trace,
        workers=workers,
        ray=ray,
        progress=None if err is None or not err.is_terminal else err,
    )
    d = build_diagnosis(paths, opts)
    cfg = opts.server_config
    if html is not None:
        from perfscope.report.html import write_diagnosis_html

        write_diagnosis_html(html, d, cfg, announce=err or _stderr())
    if markdown is not None:
        from perfscope.report.markdown import diagnosis_markdown
        from perfscope.util.files import atomic_write_text

        atomic_write_text(markdown, diagnosis_markdown(d, top=top), shared=True)
        (err or _stderr()).print(f"markdown summary written: {markdown}", markup=False, highlight=False)
    if csv_dir is not None:
        from perfscope.report.markdown import write_csv

        files = write_csv(csv_dir, d)
        (err or _stderr()).print(
            f"CSV tables written: {', '.join(str(f) for f in files)}", markup=False, highlight=False
        )
    if json_out:
        from perfscope.report import jsonout
        from perfscope.report.view import diagnosis_json

        jsonout.emit(diagnosis_json(d))
    else:
        from perfscope.report import terminal
        from perfscope.report.escape import Console

        terminal.render(d, Console(), top=top)
    gate(d.primary.findings, fail_on)
    return 0
