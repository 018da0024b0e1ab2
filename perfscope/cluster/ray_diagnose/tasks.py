"""The node side of ``diagnose --ray``: these run in Ray workers, on the node that holds the files."""

from __future__ import annotations

import pickle
import socket
import time
from typing import Optional

from perfscope import __version__
from perfscope.errors import PerfscopeError
from perfscope.load.discover import TraceFile


def survey(paths: list[str]) -> dict:
    """What this node holds under each of ``paths``: ``{"hostname", "version", "paths": [...]}`` with
    per path either ``{"error": line}`` or ``{"tset": TraceSet, "files": [{fingerprint, json_bytes}]}``."""
    from perfscope.analysis.parallel import json_bytes
    from perfscope.load.discover import _fingerprint, discover

    out: dict = {"hostname": socket.gethostname(), "version": __version__, "paths": []}
    for p in paths:
        try:
            ts = discover([p])
            info = [
                {"fp": _fingerprint(tf.path), "json_bytes": json_bytes(tf.path), "bytes": tf.path.stat().st_size}
                for tf in ts.files
            ]
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
