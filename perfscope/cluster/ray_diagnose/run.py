"""``diagnose --ray`` from start to end: the rank tasks submitted to their nodes, retried on another
holder when their node is lost, and their results reduced here (:func:`diagnose_on_ray`)."""

from __future__ import annotations

import pickle
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from perfscope.analysis.result import Diagnosis, RankAnalysis
from perfscope.cluster.ray_diagnose.nodes import alive_nodes, cancel, connect, gather, gather_some, pinned
from perfscope.cluster.ray_diagnose.place import Job, Survey, plan
from perfscope.cluster.ray_diagnose.tasks import analyse, host_timing
from perfscope.errors import InputError, RemoteError


@dataclass
class RayRun:
    """How a ``--ray`` diagnosis ran: where each rank went, what moved, what was retried or lost."""

    nodes: dict  # node id -> name
    placement: dict = field(default_factory=dict)  # file (_where) -> name of the node that analysed it
    retried: list[str] = field(default_factory=list)  # one line per retry
    missing: list[str] = field(default_factory=list)  # one line per rank lost with its node
    trace_bytes: int = 0  # what the copy-everything path would move (the files, as stored)
    moved_bytes: int = 0  # what moved here: survey replies, task arguments, results
    seconds: float = 0.0
    task_seconds: float = 0.0  # the rank tasks' own time on their nodes, summed


def diagnose_on_ray(
    paths: list[str | Path],
    config: Optional[dict] = None,
    *,
    address: Optional[str] = None,
    capture: Optional[list[str | Path]] = None,
    on_done: Optional[Callable[[int, int], None]] = None,
    planned: Optional[Survey] = None,
) -> tuple[Diagnosis, RayRun]:
    """The diagnosis of ``paths`` with every rank analysed on the node that holds its file.
    ``on_done(ranks_done, ranks_total)`` follows the results as they arrive (a lost rank counts as
    done). ``planned``: a :func:`plan` made earlier (the same cluster)."""
    from perfscope.analysis.parallel import PEAK_PER_JSON_BYTE
    from perfscope.analysis.split import reduce, run_config

    t0 = time.perf_counter()
    ray, ours = connect(address)
    try:
        sv = planned or plan(ray, paths)
        nodes = sv.nodes
        run = RayRun(nodes={i: n.name() for i, n in nodes.items()}, moved_bytes=sv.moved)
        cfg_in = dict(config or {})
        ht_node = sv.host_timing_node  # the node holding sv.tset.host_timing (set with it)
        if (
            sv.tset.host_timing
            and ht_node is not None
            and "host_timing" not in cfg_in
            and "host_timing" not in sv.tset.server_info
        ):
            ref = (
                ray.remote(host_timing)
                .options(num_cpus=1, scheduling_strategy=pinned(ht_node))
                .remote(sv.tset.host_timing, sv.tset.run_info.get("workload"))
            )
            status, ht = gather(ray, {ref: ht_node})[ref]
            if status == "ok" and ht:
                cfg_in["host_timing"] = ht
        cfg = run_config(sv.tset, cfg_in, host_timing=False)
        cap = list(capture or []) + list(sv.tset.capture) if sv.tset.capture else capture
        task = ray.remote(analyse)
        results: list[Optional[RankAnalysis]] = [None] * len(sv.jobs)
        pending: dict = {}

        def submit(job: Job) -> None:
            job.tried.append(job.node)
            mem = job.json_bytes * PEAK_PER_JSON_BYTE
            cap_mem = 0.9 * nodes[job.node].memory if nodes[job.node].memory else 0
            opts = {"num_cpus": 1, "max_retries": 0, "scheduling_strategy": pinned(job.node)}
            if cap_mem:
                opts["memory"] = int(max(1, min(mem, cap_mem)))
            args = (job.tf, cfg, cap)
            run.moved_bytes += len(pickle.dumps(args, protocol=5))
            pending[task.options(**opts).remote(*args)] = job

        for job in sv.jobs:
            run.trace_bytes += job.bytes
            submit(job)
        done = 0
        while pending:
            got = gather_some(ray, pending)
            for ref, (status, out) in got.items():
                job = pending.pop(ref)
                if status == "ok" and "error" in out:
                    for r in pending:
                        cancel(ray, r)
                    raise InputError(f"{out['error']} (on node {nodes[job.node].name()})")
                if status == "ok":
                    results[job.index] = RankAnalysis.from_dict(out["ok"])
                    run.moved_bytes += out["bytes"]
                    run.task_seconds += out["seconds"]
                    run.placement[_where(job)] = nodes[job.node].name()
                else:
                    live = alive_nodes(ray)
                    others = [n for n in job.holders if n not in job.tried and n in live]
                    what = f"rank {job.tf.rank if job.tf.rank is not None else '?'} ({job.tf.path.name})"
                    if others:
                        lost_on = nodes[job.node].name()
                        job.node = others[0]
                        run.retried.append(
                            f"{what}: lost on node {lost_on} ({out}), retried on node {nodes[job.node].name()}"
                        )
                        submit(job)
                        continue
                    run.missing.append(
                        f"{what} missing: its node {nodes[job.node].name()} was lost ({out}) "
                        "and no other node holds the file"
                    )
                done += 1
                if on_done:
                    on_done(done, len(sv.jobs))
        ranks = [r for r in results if r is not None]
        if not ranks:
            raise RemoteError(f"--ray: no rank could be analysed: {run.missing[0]}")
        used = sorted({run.placement[_where(j)] for j in sv.jobs if _where(j) in run.placement})
        d = reduce(sv.tset, ranks, {"files": len(sv.jobs), "workers": len(used), "bound": "ray"}, warnings=run.missing)
        run.seconds = round(time.perf_counter() - t0, 3)
        return d, run
    finally:
        if ours:
            ray.shutdown()


def _where(job: Job) -> str:
    """A rank's file as RayRun.placement names it: its path (``HOST:PATH`` when the path alone is
    ambiguous: the same path on several nodes, different files)."""
    return f"{job.tf.host}:{job.tf.path}" if job.tf.host and not job.pinned else str(job.tf.path)
