"""The run folder: what ``perfscope trace`` (and ``bench``) leave behind, and what ``diagnose``,
``report`` and ``compare`` read.

Layout::

    RUN_DIR/run.json                    what was run, where, versions, server config, timings, files
    RUN_DIR/traces/*.trace.json[.gz]    one Kineto chrome trace per rank (per stage), as the server named it

Several hosts (``trace --host a --host b``): every host gets a complete run folder of its own,
``RUN_DIR/<host>/``, and ``RUN_DIR/run.json`` lists them under ``members`` and lists every host's
trace files (paths relative to RUN_DIR). ``read_run(RUN_DIR)`` then returns the first host's
``server_info`` / ``versions`` / ``gpu`` / ``timings`` at the top and all hosts in ``members``.

run.json (schema_version 1)::

    {
      "schema_version": 1,
      "tool": {"name": "perfscope", "version": "0.1.0"},
      "created": "2025-01-01T12:00:00+00:00",   # UTC, ISO 8601
      "kind": "trace" | "bench" | "multi",
      "command": ["perfscope", "trace", ...],   # argv with secrets removed
      "host": "gpu1" | null,                    # label of the host (null: local --url)
      "hosts": ["gpu1", ...],
      "url": "http://...",                      # how the server was reached (forwarded or direct)
      "engine": "sglang" | "vllm",
      "versions": {"sglang": "0.5.5", "flashinfer": "...", "torch": "...", "python": "...", "server": "..."},
      "server_info": {...},                     # the server's /server_info (or /get_server_info) dict
      "gpu": [{"index": 0, "name": "NVIDIA H200", "clocks_sm_mhz": ..., ...}],
      "workload": {"concurrency": 1, "input_len": ..., "output_len": ..., "requests": ..., ...},
      "timings": {"ttft_ms": ..., "tpot_ms": ..., "itl_ms": {"p50": ..., "p90": ..., "p99": ...}, ...},
      "profile": {"output_dir": "/tmp/...", "num_steps": 20, "with_stack": true, ...},
      "files": [{"path": "traces/...trace.json.gz", "sha256": "...", "bytes": 123,
                 "rank": 0, "stage": "DECODE" | "EXTEND" | null, "host": "gpu1",
                 "parallel": {"tp": 0, "dp": null, "pp": null, "ep": null}}],
      "members": [{"host": "gpu1", "dir": "gpu1"}]   # "multi" only
    }

``trace --analyse-on-host`` (:mod:`perfscope.cluster.onhost`): ``files`` is empty (no trace here),
``remote_files`` lists each trace where it stays (the ``files`` fields, plus ``remote_path`` on its
host; ``path`` is where ``trace --fetch`` puts it), ``analysis`` says how it went (``where: "host"``,
``status``, ``results: "ranks.json.gz"``, interpreter, bytes), and ``ranks.json.gz`` holds the results.

Unknown keys are kept (``RunInfo.data``), so later versions may add fields without a bump.

The names and the typed view: :mod:`perfscope.rundir.schema`; writing run.json: :mod:`perfscope.rundir.write`;
reading and validating it: :mod:`perfscope.rundir.read`.
"""

from perfscope.rundir.read import read_run, trace_files
from perfscope.rundir.schema import (
    FRONTEND_NOTE,
    HOST_TIMING_DIR,
    RUN_FILE,
    SCHEMA_VERSION,
    TRACE_GLOBS,
    TRACES_DIR,
    RunInfo,
    TraceFile,
    parse_trace_name,
)
from perfscope.rundir.write import file_entry, mark_incomplete, update_run, write_run

__all__ = [
    "SCHEMA_VERSION",
    "RUN_FILE",
    "TRACES_DIR",
    "HOST_TIMING_DIR",
    "TRACE_GLOBS",
    "FRONTEND_NOTE",
    "TraceFile",
    "RunInfo",
    "write_run",
    "update_run",
    "mark_incomplete",
    "read_run",
    "trace_files",
    "parse_trace_name",
    "file_entry",
]
