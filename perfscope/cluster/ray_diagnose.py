"""``perfscope diagnose --ray [ADDRESS]``: each rank's analysis runs on the Ray node that holds its trace
file; only the results (~100 KB a rank) travel to this machine, which reduces them.

1. Survey: one small task pinned to every live node with a CPU finds the trace files under the given
   paths *on that node* (:func:`perfscope.load.discover.discover` there): each file's size and a
   fingerprint (size and a hash of its first and last MiB), the run folder's run.json.
2. Place: each file goes to a node that holds it. A file the run folder lists under a host
   (``files[].host`` of run.json) goes to that host's node (a node labelled ``perfscope-host=HOST``,
   else the node whose hostname or IP is the host's) and only there; any other file to one of the
   nodes that hold the same bytes at that path (one node for node-local folders; on a shared file
   system, the least loaded), spread over the nodes.
3. Map: :func:`perfscope.analysis.split.rank_task` per file, pinned by ``NodeAffinitySchedulingStrategy``
   (hard), one CPU each and the memory its parse peaks at, so a node parses only what fits.
   Results stream back as they finish.
4. Reduce: :func:`perfscope.analysis.split.reduce` on the results only, here: the same diagnosis as
   ``diagnose`` of the same files on one machine.

A node that dies (or whose task's worker dies) costs its pending ranks one retry each on another
node holding the same file; a rank with no such node is reported missing in one line and the others
are diagnosed. The loop checks the nodes' liveness while it waits: it never hangs on a dead node.
A rank file missing on its node, or a trace it cannot read, stops the run as locally (one line,
exit 2)."""

from __future__ import annotations

import logging
import os
import pickle
import socket
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Optional

from perfscope import __version__
from perfscope.analysis.result import Diagnosis, RankAnalysis
from perfscope.errors import InputError, PerfscopeError, RemoteError
from perfscope.load.discover import TraceFile, TraceSet

INSTALL = "pip install 'perfscope[ray]'"
HOST_LABEL = "perfscope-host"  # a node started with --labels perfscope-host=HOST runs that host's ranks
POLL_S = 1.0  # how often the wait loop checks the nodes' liveness
SURVEY_TIMEOUT_S = 300.0


def import_ray():
    """``ray``, or InputError (exit 2) saying how to install it."""
    try:
        import ray
    except ImportError:
        raise InputError(f"--ray needs Ray, which is not installed here: {INSTALL}") from None
    return ray


# --- node side: these run in Ray workers, on the node that holds the files -------------------------

def survey(paths: list[str]) -> dict:
    """What this node holds under each of ``paths``: ``{"hostname", "version", "paths": [...]}`` with
    per path either ``{"error": line}`` or ``{"tset": TraceSet, "files": [{fingerprint, json_bytes}]}``."""
    from perfscope.analysis.parallel import json_bytes
    from perfscope.load.discover import _fingerprint, discover

    out: dict = {"hostname": socket.gethostname(), "version": __version__, "paths": []}
    for p in paths:
        try:
            ts = discover([p])
            info = [{"fp": _fingerprint(tf.path), "json_bytes": json_bytes(tf.path), "bytes": tf.path.stat().st_size}
                    for tf in ts.files]
        except (PerfscopeError, OSError) as e:
            out["paths"].append({"error": str(e) if isinstance(e, PerfscopeError) else f"{p}: {e.strerror or e}"})
            continue
        out["paths"].append({"tset": ts, "files": info})
    return out


def analyse(tf: TraceFile, config: dict, capture: Optional[list]) -> dict:
    """The rank task where the file is; ``bytes`` is the size of what goes back (pickled)."""
    from perfscope.analysis.split import rank_task

    t0 = time.perf_counter()
    out = rank_task(tf, config, capture)
    out["seconds"] = round(time.perf_counter() - t0, 3)
    out["bytes"] = len(pickle.dumps(out, protocol=5))
    return out


def host_timing(files: list, workload: Optional[dict]) -> Optional[dict]:
    """The run folder's GPU-only profile read where it is (:func:`perfscope.analysis.hosttime.of_run`)."""
    from perfscope.analysis import hosttime

    return hosttime.of_run(files, workload)


# --- this machine ----------------------------------------------------------------------------------

@dataclass
class Node:
    id: str
    ip: str
    hostname: str
    labels: dict
    cpus: float
    memory: float

    def name(self) -> str:
        label = self.labels.get(HOST_LABEL)
        return f"{label} ({self.ip})" if label else (self.hostname if self.hostname == self.ip else
                                                     f"{self.hostname} ({self.ip})")


@dataclass
class Job:
    index: int
    tf: TraceFile
    holders: list[str]  # node ids that hold this file (the bytes the survey fingerprinted)
    json_bytes: int
    bytes: int
    pinned: bool = False  # placed by the run folder's host: runs there or nowhere
    node: str = ""
    tried: list[str] = field(default_factory=list)


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


def connect(address: Optional[str]):
    """Join the Ray cluster at ``address`` (None: ``auto``, the one this machine is part of). Returns
    (ray, whether we connected: disconnect after)."""
    ray = import_ray()
    if ray.is_initialized():
        return ray, False
    _reachable(address or os.environ.get("RAY_ADDRESS") or "")
    try:
        ray.init(address=address or "auto", logging_level=logging.ERROR, log_to_driver=False,
                 configure_logging=True)
    except (ConnectionError, RuntimeError, ValueError) as e:
        why = " ".join(str(e).split())[:300]
        if "Could not find any running Ray instance" in why:
            why = "none runs on this machine and RAY_ADDRESS is not set"
        opt = f"--ray {address}" if address else "--ray"
        raise RemoteError(f"{opt}: no Ray cluster reachable ({why}); start one (ray start --head) or give its "
                          "address (--ray HOST:6379)") from None
    return ray, True


CONNECT_TIMEOUT_S = 10.0


def _reachable(address: str) -> None:
    """A ``HOST:PORT`` address answers TCP within CONNECT_TIMEOUT_S, or RemoteError (exit 3): Ray's
    own client retries an unreachable head for minutes."""
    if address in ("", "auto") or "://" in address:
        return
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise InputError(f"--ray {address}: not a Ray address (HOST:PORT, ray://HOST:PORT)")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as e:
        raise RemoteError(f"--ray {address}: no Ray cluster reachable ({e.strerror or type(e).__name__}); start "
                          "one there (ray start --head) or give its address") from None


def alive_nodes(ray) -> dict[str, Node]:
    """Live nodes with at least one CPU (a node without one could never run a rank task)."""
    out = {}
    for n in ray.nodes():
        res = n.get("Resources") or {}
        if not n.get("Alive") or res.get("CPU", 0) < 1:
            continue
        out[n["NodeID"]] = Node(id=n["NodeID"], ip=n.get("NodeManagerAddress", ""),
                                hostname=n.get("NodeManagerHostname", ""), labels=dict(n.get("Labels") or {}),
                                cpus=res.get("CPU", 0), memory=res.get("memory", 0))
    return out


def _pinned(node_id: str):
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)


def _gather(ray, refs: dict, timeout: Optional[float] = None) -> dict:
    """``{ref: node_id}`` -> ``{ref: ("ok", value) | ("lost", why)}``: waits for every ref, and stops
    waiting for a ref whose node is no longer alive."""
    out = {}
    pending = dict(refs)
    deadline = None if timeout is None else time.monotonic() + timeout
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=POLL_S)
        for ref in ready:
            out[ref] = _get(ray, ref)
            pending.pop(ref)
        if pending:
            live = alive_nodes(ray)
            for ref, node in list(pending.items()):
                if node not in live:
                    _cancel(ray, ref)
                    out[ref] = ("lost", "its node left the cluster")
                    pending.pop(ref)
            if deadline is not None and time.monotonic() > deadline:
                for ref in pending:
                    _cancel(ray, ref)
                    out[ref] = ("lost", f"no answer in {timeout:.0f} s")
                break
    return out


def _get(ray, ref):
    try:
        return ("ok", ray.get(ref))
    except ray.exceptions.RayTaskError as e:
        cause = e.cause if getattr(e, "cause", None) is not None else e
        if isinstance(cause, (ImportError, AttributeError)):
            return ("lost", f"perfscope {__version__} does not run there ({type(cause).__name__}: "
                            f"{' '.join(str(cause).split())[:200]}); install it on every node: {INSTALL}")
        raise cause from None
    except ray.exceptions.RayError as e:  # the worker or its node died, the task was cancelled, ...
        return ("lost", _LOST.get(type(e).__name__) or f"{type(e).__name__}: {' '.join(str(e).split())[:160]}")


_LOST = {  # Ray's errors for a task that did not come back, in a few words
    "NodeDiedError": "its node died while it ran",
    "TaskUnschedulableError": "its node is gone",
    "WorkerCrashedError": "its worker process died",
    "LocalRayletDiedError": "its node's raylet died",
    "OutOfMemoryError": "Ray's memory monitor killed it (out of memory on its node)",
    "TaskCancelledError": "cancelled",
    "ObjectLostError": "its result was lost with its node",
}


def _cancel(ray, ref) -> None:
    try:
        ray.cancel(ref, force=True)
    except Exception:  # already finished, or its node is gone: nothing left to stop
        pass


def _host_of(label: Optional[str]) -> Optional[str]:
    """A run folder's host label as a host name: ``me@gpu-box:22`` -> ``gpu-box``."""
    if not label:
        return None
    h = label.rsplit("@", 1)[-1]
    if h.count(":") == 1:
        h = h.split(":", 1)[0]
    return h.strip("[]") or None


def nodes_of_host(label: Optional[str], nodes: dict[str, Node]) -> list[str]:
    """The nodes a run folder's host label names: by the ``perfscope-host`` node label, else by
    hostname, else by IP (the name resolved here)."""
    host = _host_of(label)
    if not host:
        return []
    hit = [i for i, n in nodes.items() if n.labels.get(HOST_LABEL) in (label, host)]
    if hit:
        return hit
    if any(HOST_LABEL in n.labels for n in nodes.values()):
        return []  # the nodes say which host each is: this one is none of them
    short = host.split(".")[0]
    hit = [i for i, n in nodes.items() if n.hostname in (host, short) or n.hostname.split(".")[0] == short]
    if hit:
        return hit
    try:
        ip = socket.gethostbyname(host)
    except OSError:
        ip = host
    return [i for i, n in nodes.items() if n.ip in (host, ip)]


@dataclass
class Survey:
    tset: TraceSet  # the files of every node, merged as discover() merges paths on one machine
    jobs: list[Job]
    host_timing_node: Optional[str]
    nodes: dict[str, Node]
    moved: int


def plan(ray, paths: list[str | Path], nodes: Optional[dict[str, Node]] = None) -> Survey:
    """Survey every live node and place each file on a node that holds it."""
    nodes = nodes if nodes is not None else alive_nodes(ray)
    if not nodes:
        raise RemoteError("--ray: the cluster has no live node with a CPU to run the analysis on")
    remote = ray.remote(survey)
    strs = [str(p) for p in paths]
    refs = {remote.options(num_cpus=0, scheduling_strategy=_pinned(i)).remote(strs): i for i in nodes}
    got = _gather(ray, refs, timeout=SURVEY_TIMEOUT_S)
    replies: dict[str, dict] = {}
    moved = 0
    for ref, (status, val) in got.items():
        node = refs[ref]
        if status == "lost":
            raise RemoteError(f"--ray: node {nodes[node].name()} did not answer the survey: {val}")
        if val["version"] != __version__:
            raise RemoteError(f"--ray: node {nodes[node].name()} runs perfscope {val['version']}, this machine "
                              f"{__version__}: install the same version on every node ({INSTALL})")
        replies[node] = val
        moved += len(pickle.dumps(val, protocol=5))
    order = list(nodes)  # ray.nodes() order: stable for a cluster
    files: list[tuple[TraceFile, dict, str]] = []
    run_dir, run_info, host_timing_files, ht_node = None, {}, [], None
    skipped: list = []
    capture: list = []
    frontend: list = []
    dups: list = []
    for k in range(len(strs)):
        found = [(n, replies[n]["paths"][k]) for n in order if "tset" in replies[n]["paths"][k]]
        if not found:
            why = next(iter(replies.values()))["paths"][k]["error"]
            raise InputError(f"{why} (on every one of the {len(nodes)} Ray node(s): "
                             f"{', '.join(sorted({n.name() for n in nodes.values()}))})")
        # as discover() of several paths: the last run folder given is the run (the first node holding it)
        ts0 = next((rep["tset"] for _, rep in found if rep["tset"].run_dir is not None), None)
        if ts0 is not None:
            run_dir, run_info = ts0.run_dir, ts0.run_info
        ht = next(((n, rep["tset"]) for n, rep in found if rep["tset"].host_timing), None)
        if ht is not None:
            ht_node, host_timing_files = ht[0], ht[1].host_timing
        for n, rep in found:
            ts: TraceSet = rep["tset"]
            for tf, info in zip(ts.files, rep["files"]):
                files.append((tf, info, n))
            for seen, new in ((skipped, ts.skipped), (capture, ts.capture), (frontend, ts.frontend),
                              (dups, ts.duplicates)):
                for x in new:
                    if x not in seen:
                        seen.append(x)
    # the same path with the same bytes on several nodes (a shared file system): one file, several holders
    jobs: list[Job] = []
    by_key: dict = {}
    by_bytes: dict = {}
    for tf, info, n in files:
        key = (str(tf.path), info["fp"])
        if key in by_key:
            job = by_key[key]
            if n in job.holders:
                dups.append({"path": str(tf.path), "same_as": str(job.tf.path), "how": "same path"})
            else:
                job.holders.append(n)
            continue
        if len(files) > 1 and info["fp"] in by_bytes and str(by_bytes[info["fp"]].tf.path) != str(tf.path):
            dups.append({"path": str(tf.path), "same_as": str(by_bytes[info["fp"]].tf.path), "how": "identical bytes"})
            continue
        job = Job(index=len(jobs), tf=tf, holders=[n], json_bytes=info["json_bytes"], bytes=info["bytes"])
        by_key[key] = job
        by_bytes.setdefault(info["fp"], job)
        jobs.append(job)
    # one path holding different bytes on different nodes (node-local folders of the same name): files of
    # different hosts, each named by its node as a run folder names each file's host
    same_path: dict = {}
    for j in jobs:
        same_path.setdefault(str(j.tf.path), []).append(j)
    for group in same_path.values():
        if len(group) > 1:
            for j in group:
                if not j.tf.host:
                    n = nodes[j.holders[0]]
                    j.tf = replace(j.tf, host=n.labels.get(HOST_LABEL) or n.hostname or n.ip)
    jobs.sort(key=lambda j: (j.tf.host or "", j.tf.rank if j.tf.rank is not None else -1, j.tf.stage or "",
                             j.tf.path.name))
    for i, j in enumerate(jobs):
        j.index = i
    # place: the run folder's host first (pinned), else spread over the holders by the bytes to parse
    load = {n: 0 for n in nodes}
    for j in sorted(jobs, key=lambda j: -j.json_bytes):
        host_nodes = [n for n in nodes_of_host(j.tf.host, nodes) if n in j.holders]
        if host_nodes:
            j.holders, j.pinned = host_nodes, True
        elif j.tf.host and nodes_of_host(j.tf.host, nodes):
            names = ", ".join(nodes[n].name() for n in nodes_of_host(j.tf.host, nodes))
            raise InputError(f"rank {j.tf.rank} ({j.tf.path}): its host {j.tf.host} is node {names}, which does not "
                             "hold this file")
        j.node = min(j.holders, key=lambda n: (load[n] / max(nodes[n].cpus, 1), order.index(n)))
        load[j.node] += j.json_bytes
    tset = TraceSet(files=[j.tf for j in jobs], run_dir=run_dir, run_info=run_info, skipped=skipped,
                    capture=capture, duplicates=dups, frontend=frontend, host_timing=host_timing_files)
    if not jobs:
        raise InputError(f"{frontend[0].name if frontend else strs[0]}: no rank trace to analyse on any Ray node")
    return Survey(tset=tset, jobs=jobs, host_timing_node=ht_node, nodes=nodes, moved=moved)


def diagnose_on_ray(paths: list[str | Path], config: Optional[dict] = None, *, address: Optional[str] = None,
                    capture: Optional[list[str | Path]] = None,
                    on_done: Optional[Callable[[int, int], None]] = None,
                    planned: Optional[Survey] = None) -> tuple[Diagnosis, RayRun]:
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
        if sv.tset.host_timing and "host_timing" not in cfg_in and "host_timing" not in sv.tset.server_info:
            ref = ray.remote(host_timing).options(num_cpus=1, scheduling_strategy=_pinned(sv.host_timing_node)).remote(
                sv.tset.host_timing, sv.tset.run_info.get("workload"))
            status, ht = _gather(ray, {ref: sv.host_timing_node})[ref]
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
            opts = {"num_cpus": 1, "max_retries": 0, "scheduling_strategy": _pinned(job.node)}
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
            got = _gather_some(ray, pending)
            for ref, (status, out) in got.items():
                job = pending.pop(ref)
                if status == "ok" and "error" in out:
                    for r in pending:
                        _cancel(ray, r)
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
                        run.retried.append(f"{what}: lost on node {lost_on} ({out}), retried on node "
                                           f"{nodes[job.node].name()}")
                        submit(job)
                        continue
                    run.missing.append(f"{what} missing: its node {nodes[job.node].name()} was lost ({out}) "
                                       "and no other node holds the file")
                done += 1
                if on_done:
                    on_done(done, len(sv.jobs))
        ranks = [r for r in results if r is not None]
        if not ranks:
            raise RemoteError(f"--ray: no rank could be analysed: {run.missing[0]}")
        used = sorted({run.placement[_where(j)] for j in sv.jobs if _where(j) in run.placement})
        d = reduce(sv.tset, ranks, {"files": len(sv.jobs), "workers": len(used), "bound": "ray"},
                   warnings=run.missing)
        run.seconds = round(time.perf_counter() - t0, 3)
        return d, run
    finally:
        if ours:
            ray.shutdown()


def _where(job: Job) -> str:
    """A rank's file as RayRun.placement names it: its path (``HOST:PATH`` when the path alone is
    ambiguous: the same path on several nodes, different files)."""
    return f"{job.tf.host}:{job.tf.path}" if job.tf.host and not job.pinned else str(job.tf.path)


def _gather_some(ray, pending: dict) -> dict:
    """The refs of ``pending`` ({ref: Job}) that finished, or whose node left, waiting at most POLL_S."""
    ready, _ = ray.wait(list(pending), num_returns=1, timeout=POLL_S)
    if ready:
        ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=0)
    out = {ref: _get(ray, ref) for ref in ready}
    if len(out) < len(pending):
        live = alive_nodes(ray)
        for ref, job in pending.items():
            if ref not in out and job.node not in live:
                _cancel(ray, ref)
                out[ref] = ("lost", "its node left the cluster")
    return out
