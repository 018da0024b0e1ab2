"""The one way every command turns its inputs into a :class:`Diagnosis` (``diagnose``, ``report``,
``compare``, ``fix --trace``): the stored results of a run folder analysed on its host, the ranks
on the Ray nodes that hold them, or the traces read here; then each finding's fix command aimed
at the run and its one input, as every renderer prints it."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Optional, Sequence

from perfscope.analysis.result import Diagnosis

if TYPE_CHECKING:  # rich (its console, its progress bars) loads when a terminal shows them
    from rich.progress import Progress

    from perfscope.report.escape import Console


def load_config(path: Optional[Path]) -> dict:
    """``--config``: the server's config as JSON (SGLang's /server_info); {} without one."""
    if path is None:
        return {}
    from perfscope.util import jsonio

    return jsonio.read(path, "server config: a JSON object, SGLang's /server_info", expect=dict)


@dataclass
class DiagnosisOptions:
    """What the commands' options say about how to diagnose (each None: not given)."""

    config: Optional[Path] = None  # --config: the server's config
    model_config: Optional[Path] = None  # --model-config, --batch, --context: the floor's inputs
    batch: Optional[int] = None
    context: Optional[int] = None
    server_log: Optional[Path] = None  # --server-log
    capture_trace: Optional[list[Path]] = None  # --capture-trace
    workers: Optional[int] = None  # --workers
    ray: Optional[str] = None  # --ray [ADDRESS]: "auto", the cluster this machine is part of
    progress: Optional[Console] = None  # where progress bars go (stderr on a terminal); None: none

    @cached_property
    def server_config(self) -> dict:
        """The server's config the ranks are analysed with: ``--config``, the floor's options, the server log."""
        from perfscope.analysis.floor import with_floor_inputs

        cfg = with_floor_inputs(load_config(self.config), self.model_config, self.batch, self.context)
        if self.server_log is not None:
            from perfscope.analysis.moe_config import read_log

            cfg["server_log"] = read_log(self.server_log)
        return cfg

    def analysis_options(self) -> list[str]:
        """The options given that change each rank's analysis (a stored result cannot take them)."""
        return [
            o
            for o, v in (
                ("--config", self.config),
                ("--model-config", self.model_config),
                ("--batch", self.batch),
                ("--context", self.context),
                ("--server-log", self.server_log),
                ("--capture-trace", self.capture_trace),
                ("--ray", self.ray),
            )
            if v
        ]


def build_diagnosis(paths: Sequence[Path], options: Optional[DiagnosisOptions] = None) -> Diagnosis:
    """The diagnosis of ``paths`` as ``options`` say, its fix commands aimed at the run and its one input."""
    from perfscope.cluster import onhost_stored

    opts = options or DiagnosisOptions()
    stored = onhost_stored.on_host_folder(list(paths))
    if stored is not None:  # trace --analyse-on-host: its results, made on the host, without these options
        onhost_stored.refuse_options(stored, opts.analysis_options())
        d = onhost_stored.stored_diagnosis(stored)
    elif opts.ray is not None:
        d = _on_ray(paths, opts)
    else:
        d = _here(paths, opts)
    d.aim(paths)
    return d


def _bar(console: Console) -> Progress:
    from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )


def _here(paths: Sequence[Path], opts: DiagnosisOptions) -> Diagnosis:
    from perfscope.analysis.diagnose import diagnose

    cfg, capture = opts.server_config, opts.capture_trace
    if opts.progress is None:
        return diagnose(paths, cfg, workers=opts.workers, capture=capture)
    with _bar(opts.progress) as prog:
        task = prog.add_task("reading traces", total=None)
        return diagnose(
            paths,
            cfg,
            workers=opts.workers,
            capture=capture,
            on_read=lambda done, total: prog.update(
                task, description="reading trace" if done < total else "analysing", completed=done, total=total
            ),
            on_done=lambda done, total: prog.update(
                task, description=f"analysed {done}/{total} trace files", completed=done, total=total
            ),
        )


def _on_ray(paths: Sequence[Path], opts: DiagnosisOptions) -> Diagnosis:
    """``--ray``: the ranks on the nodes that hold them, a progress bar of the results as they arrive;
    retried and missing ranks said in one line each on stderr."""
    from perfscope.cluster.ray_diagnose import diagnose_on_ray, import_ray

    cfg = opts.server_config
    capture: Optional[list[str | Path]] = list(opts.capture_trace) if opts.capture_trace is not None else None
    import_ray()  # not installed: one line, exit 2, before anything else
    addr = None if opts.ray == "auto" else opts.ray
    if opts.progress is None:
        d, run = diagnose_on_ray(list(paths), cfg, address=addr, capture=capture)
    else:
        with _bar(opts.progress) as prog:
            task = prog.add_task("surveying the Ray nodes", total=None)
            d, run = diagnose_on_ray(
                list(paths),
                cfg,
                address=addr,
                capture=capture,
                on_done=lambda done, total: prog.update(
                    task, description=f"analysed {done}/{total} ranks on their nodes", completed=done, total=total
                ),
            )
    from perfscope.report.escape import Console

    err = opts.progress or Console(stderr=True, soft_wrap=True)
    for line in run.retried + run.missing:
        err.print(line, markup=False, highlight=False)
    return d
