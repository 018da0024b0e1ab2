"""Capturing traces from live servers: SSH transport (ssh/), the server's HTTP API
(sglang_api.py), the load that makes decode steps run (workload.py), the trace flow (trace.py)
and the run folder format (rundir.py)."""
