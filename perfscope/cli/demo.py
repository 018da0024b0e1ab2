"""`perfscope demo`: trace, diagnose, fix and re-measure the reproduction server, on this machine."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import typer

from perfscope.cli import _paths
from perfscope.errors import InputError
from perfscope.report.escape import Console
from perfscope.util.files import user_path

NAME = "demo"
ORDER = 5
EXAMPLES = [
    (
        "perfscope demo",
        "the whole loop on CPU, into ./perfscope-demo-<time>: trace, diagnose, fix, re-measure, compare",
    ),
    ("perfscope demo --out demo1 --json", "the same into ./demo1, the summary as JSON on stdout"),
    ("perfscope demo --device cuda --layers 60 --pool-tokens 495000", "the full-size server on a GPU"),
]


def command(
    out: Optional[Path] = _paths.out_option(
        "--out",
        "-o",
        help="Folder for the run folders, the HTML comparison and demo.json (default ./perfscope-demo-<time>).",
    ),
    device: str = typer.Option("cpu", "--device", help="cpu, or cuda for the full-size server on a GPU."),
    layers: int = typer.Option(4, "--layers", min=1, help="Model layers (one pool cast each)."),
    pool_tokens: int = typer.Option(32768, "--pool-tokens", min=1024, help="KV pool size in tokens."),
    strategy: str = typer.Option("auto", "--strategy", help="Fix strategy: auto, native or pages."),
    json_out: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
) -> None:
    """Run the whole loop on a small MLA decode server that carries SGLang's FP8 KV-cast bug: start it
    (CPU by default, needs the `demo` extra: torch), measure TPOT, trace it through its profiling API,
    diagnose the trace, apply the fp8-kv-cast fix to a scratch copy of its source, restart, measure
    and trace again, and write an HTML before/after comparison. Takes one to a few minutes on CPU, depending on the machine's cores and load."""
    if not (device == "cpu" or device == "cuda" or (device.startswith("cuda:") and device[5:].isdigit())):
        raise InputError(f"--device {device}: expected cpu, cuda or cuda:N")
    if strategy not in ("auto", "native", "pages"):
        raise InputError(f"--strategy {strategy}: expected auto, native or pages")
    try:
        import torch  # noqa: F401
    except ImportError:
        raise InputError(
            "the demo needs torch for its reproduction server: pip install 'torch==2.13.0' '.[demo]'"
        ) from None
    if device != "cpu" and not torch.cuda.is_available():
        raise InputError(
            f"--device {device}: torch {torch.__version__} sees no CUDA GPU here (the demo runs on "
            "CPU without --device)"
        )
    from perfscope.demo import DemoConfig, run_demo
    from perfscope.report import jsonout

    folder = out or user_path(Path(f"perfscope-demo-{time.strftime('%Y%m%d-%H%M%S')}"))
    console = Console(stderr=json_out)
    s = run_demo(
        DemoConfig(out=folder, device=device, layers=layers, pool_tokens=pool_tokens, strategy=strategy), console
    )
    # the result section is said either way (on stderr with --json, where the demo's steps go too)
    console.rule("[bold]result")
    console.print(
        f"TPOT before: [bold]{s['tpot_ms_before']:.1f} ms[/]   after: [bold green]{s['tpot_ms_after']:.1f} ms[/]"
        f"   ({s['speedup']:.1f}x faster)"
    )
    for key, what in (("tpot", "TPOT median"), ("step", "step median")):
        ch = (s.get("change") or {}).get(key)
        if ch:
            from perfscope.analysis.change import describe

            console.print(f"noise: {describe(ch, what)}", markup=False, soft_wrap=True)
    console.print(
        f"findings before: {', '.join(s['findings_before']) or 'none'}   after: "
        f"{', '.join(s['findings_after']) or 'none'}"
    )
    from perfscope.report.compare_terminal import prediction_line

    for pr in s.get("predictions") or []:
        console.print(prediction_line(pr), soft_wrap=True)
    # paths whole, one line each, however long (a log folded at 80 columns cannot be pasted)
    console.print(f"patch: {s['diff']}", markup=False, soft_wrap=True)
    console.print(f"HTML comparison: {s['html']}", markup=False, soft_wrap=True)
    console.print(f"run folders: {s['before']}  {s['after']}", markup=False, soft_wrap=True)
    console.print(f"took {s['seconds']:.0f} s", markup=False)
    if json_out:
        jsonout.emit(s)
