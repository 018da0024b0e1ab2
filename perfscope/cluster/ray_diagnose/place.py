"""Where each rank's file is analysed: every live node surveyed for the files under the given paths,
each file placed on a node that holds it (its run folder's host, else the least loaded holder)."""

from __future__ import annotations

import pickle
import socket
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Optional

from perfscope import __version__
from perfscope.cluster.ray_diagnose.nodes import HOST_LABEL, INSTALL, Node, alive_nodes, gather, pinned
from perfscope.cluster.ray_diagnose.tasks import survey
from perfscope.errors import InputError, RemoteError
from perfscope.load.discover import TraceFile, TraceSet

SURVEY_TIMEOUT_S = 300.0


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
    refs = {remote.options(num_cpus=0, scheduling_strategy=pinned(i)).remote(strs): i for i in nodes}
    got = gather(ray, refs, timeout=SURVEY_TIMEOUT_S)
    replies: dict[str, dict] = {}
    moved = 0
    for ref, (status, val) in got.items():
        node = refs[ref]
        if status == "lost":
            raise RemoteError(f"--ray: node {nodes[node].name()} did not answer the survey: {val}")
        if val["version"] != __version__:
            raise RemoteError(
                f"--ray: node {nodes[node].name()} runs perfscope {val['version']}, this machine "
                f"{__version__}: install the same version on every node ({INSTALL})"
            )
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
            raise InputError(
                f"{why} (on every one of the {len(nodes)} Ray node(s): "
                f"{', '.join(sorted({n.name() for n in nodes.values()}))})"
            )
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
            for seen, new in (
                (skipped, ts.skipped),
                (capture, ts.capture),
                (frontend, ts.frontend),
                (dups, ts.duplicates),
            ):
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
                    holder = nodes[j.holders[0]]
                    j.tf = replace(j.tf, host=holder.labels.get(HOST_LABEL) or holder.hostname or holder.ip)
    jobs.sort(
        key=lambda j: (j.tf.host or "", j.tf.rank if j.tf.rank is not None else -1, j.tf.stage or "", j.tf.path.name)
    )
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
            raise InputError(
                f"rank {j.tf.rank} ({j.tf.path}): its host {j.tf.host} is node {names}, which does not hold this file"
            )
        j.node = min(j.holders, key=lambda n: (load[n] / max(nodes[n].cpus, 1), order.index(n)))
        load[j.node] += j.json_bytes
    tset = TraceSet(
        files=[j.tf for j in jobs],
        run_dir=run_dir,
        run_info=run_info,
        skipped=skipped,
        capture=capture,
        duplicates=dups,
        frontend=frontend,
        host_timing=host_timing_files,
    )
    if not jobs:
        raise InputError(f"{frontend[0].name if frontend else strs[0]}: no rank trace to analyse on any Ray node")
    return Survey(tset=tset, jobs=jobs, host_timing_node=ht_node, nodes=nodes, moved=moved)
