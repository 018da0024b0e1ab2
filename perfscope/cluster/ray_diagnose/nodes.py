"""This machine's side of the Ray cluster: joining it, its live nodes, a task pinned to a node, and
waiting for tasks whose node may leave (a lost task is reported, never waited for)."""

from __future__ import annotations

import logging
import os
import socket
import time
from dataclasses import dataclass
from typing import Optional

from perfscope import __version__
from perfscope.errors import InputError, RemoteError

INSTALL = "pip install 'perfscope[ray]'"
HOST_LABEL = "perfscope-host"  # a node started with --labels perfscope-host=HOST runs that host's ranks
POLL_S = 1.0  # how often the wait loop checks the nodes' liveness


def import_ray():
    """``ray``, or InputError (exit 2) saying how to install it."""
    try:
        import ray
    except ImportError:
        raise InputError(f"--ray needs Ray, which is not installed here: {INSTALL}") from None
    return ray


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
        return (
            f"{label} ({self.ip})"
            if label
            else (self.hostname if self.hostname == self.ip else f"{self.hostname} ({self.ip})")
        )


def connect(address: Optional[str]):
    """Join the Ray cluster at ``address`` (None: ``auto``, the one this machine is part of). Returns
    (ray, whether we connected: disconnect after)."""
    ray = import_ray()
    if ray.is_initialized():
        return ray, False
    _reachable(address or os.environ.get("RAY_ADDRESS") or "")
    try:
        ray.init(address=address or "auto", logging_level=logging.ERROR, log_to_driver=False, configure_logging=True)
    except (ConnectionError, RuntimeError, ValueError) as e:
        why = " ".join(str(e).split())[:300]
        if "Could not find any running Ray instance" in why:
            why = "none runs on this machine and RAY_ADDRESS is not set"
        opt = f"--ray {address}" if address else "--ray"
        raise RemoteError(
            f"{opt}: no Ray cluster reachable ({why}); start one (ray start --head) or give its "
            "address (--ray HOST:6379)"
        ) from None
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
        raise RemoteError(
            f"--ray {address}: no Ray cluster reachable ({e.strerror or type(e).__name__}); start "
            "one there (ray start --head) or give its address"
        ) from None


def alive_nodes(ray) -> dict[str, Node]:
    """Live nodes with at least one CPU (a node without one could never run a rank task)."""
    out = {}
    for n in ray.nodes():
        res = n.get("Resources") or {}
        if not n.get("Alive") or res.get("CPU", 0) < 1:
            continue
        out[n["NodeID"]] = Node(
            id=n["NodeID"],
            ip=n.get("NodeManagerAddress", ""),
            hostname=n.get("NodeManagerHostname", ""),
            labels=dict(n.get("Labels") or {}),
            cpus=res.get("CPU", 0),
            memory=res.get("memory", 0),
        )
    return out


def pinned(node_id: str):
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)


def gather(ray, refs: dict, timeout: Optional[float] = None) -> dict:
    """``{ref: node_id}`` -> ``{ref: ("ok", value) | ("lost", why)}``: waits for every ref, and stops
    waiting for a ref whose node is no longer alive."""
    out = {}
    pending = dict(refs)
    deadline = None if timeout is None else time.monotonic() + timeout
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=POLL_S)
        for ref in ready:
            out[ref] = get_result(ray, ref)
            pending.pop(ref)
        if pending:
            live = alive_nodes(ray)
            for ref, node in list(pending.items()):
                if node not in live:
                    cancel(ray, ref)
                    out[ref] = ("lost", "its node left the cluster")
                    pending.pop(ref)
            if deadline is not None and time.monotonic() > deadline:
                for ref in pending:
                    cancel(ray, ref)
                    out[ref] = ("lost", f"no answer in {timeout:.0f} s")
                break
    return out


def get_result(ray, ref):
    try:
        return ("ok", ray.get(ref))
    except ray.exceptions.RayTaskError as e:
        cause = e.cause if getattr(e, "cause", None) is not None else e
        if isinstance(cause, (ImportError, AttributeError)):
            return (
                "lost",
                f"perfscope {__version__} does not run there ({type(cause).__name__}: "
                f"{' '.join(str(cause).split())[:200]}); install it on every node: {INSTALL}",
            )
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


def cancel(ray, ref) -> None:
    try:
        ray.cancel(ref, force=True)
    except Exception:  # already finished, or its node is gone: nothing left to stop
        pass


def gather_some(ray, pending: dict) -> dict:
    """The refs of ``pending`` ({ref: Job}) that finished, or whose node left, waiting at most POLL_S."""
    ready, _ = ray.wait(list(pending), num_returns=1, timeout=POLL_S)
    if ready:
        ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=0)
    out = {ref: get_result(ray, ref) for ref in ready}
    if len(out) < len(pending):
        live = alive_nodes(ray)
        for ref, job in pending.items():
            if ref not in out and job.node not in live:
                cancel(ray, ref)
                out[ref] = ("lost", "its node left the cluster")
    return out
