"""Run folders the tests build from the repository's real traces."""

from __future__ import annotations

from pathlib import Path

from paths import H200


def host_bubble_run(tmp_path: Path) -> Path:
    """A run folder of the H200 graph stepbench trace (mla_pages_graph) whose bench measured the
    profiled step plus 1.28 ms (the host as slow unprofiled as profiled): host-bubble costs ~1.3 ms
    per step there, mostly between steps."""
    from perfscope.analysis.diagnose import diagnose
    from perfscope.rundir import write_run

    src = H200 / "mla_pages_graph.json.xz"
    run = tmp_path / "run"
    (run / "traces").mkdir(parents=True)
    (run / "traces" / "1730000000.0-TP-0-DECODE.trace.json.gz").write_bytes(src.read_bytes())
    step = diagnose([src]).primary.steps.median_ms
    write_run(run, command=["perfscope", "trace"], engine="sglang", workload={"concurrency": 1},
              timings={"tpot_ms": 9.0, "bench": {"tpot_ms": step + 1.28, "concurrency": 1}},
              files=[{"path": "traces/1730000000.0-TP-0-DECODE.trace.json.gz"}])
    return run
