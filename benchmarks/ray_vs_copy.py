#!/usr/bin/env python
"""``diagnose --ray`` against today's copy-everything path: wall time and bytes moved, as ratios.

    python benchmarks/ray_vs_copy.py [--ranks 16,64] [--nodes 2] [--trace FILE] [--copies K] [--link-gbps 10]

N rank files (the real H200 eager trace, tests/traces/corpus/h200-mla-fp8-kv/mla_pool_eager.json.xz,
8.7 MB of JSON, 5 decode steps of 60 MLA layers, or --trace FILE; --copies K repeats its steps K
times in each rank, for larger files; each rank its own TP-r name and
its own distributedInfo rank, gzipped as the profiler writes them) are analysed two ways on a Ray
cluster of --nodes nodes of one CPU each started on this machine (``ray.cluster_utils.Cluster``;
its start is not timed, a deployment's cluster is up already):

  - copy: what ``perfscope trace`` + ``diagnose`` do today: every rank's file copied to the machine
    that runs perfscope (here a local file copy: the lower bound of the SFTP copy over a network),
    then ``diagnose`` there with its process pool on as many cores as the nodes have CPUs;
    bytes moved: the files as stored.
  - ray: ``diagnose --ray``: each rank analysed by a task on the node holding its file; bytes moved:
    the nodes' survey replies, the tasks' arguments and their results (pickled, as Ray sends them).

Both give the same diagnosis (checked: ``--json`` equal but for its ``parallel`` object). Printed per
N: each path's wall time and bytes, ray / copy for both, and the copy's transfer time alone at
--link-gbps (bytes / link speed: computed, not measured; on one machine no byte crosses a network).
"""

from __future__ import annotations

import argparse
import gzip
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
SOURCE = REPO / "tests" / "traces" / "corpus" / "h200-mla-fp8-kv" / "mla_pool_eager.json.xz"


def make_ranks(src: Path, n: int, out: Path) -> int:
    """``n`` rank files of ``src`` in ``out`` (SGLang names, distinct distributedInfo ranks); their bytes."""
    import orjson

    from perfscope.load.reader import read_bytes

    top = orjson.loads(read_bytes(src))
    out.mkdir(parents=True)
    total = 0
    for r in range(n):
        top["distributedInfo"] = {"backend": "nccl", "rank": r, "world_size": n}
        p = out / f"1790000000.1-TP-{r}.trace.json.gz"
        p.write_bytes(gzip.compress(orjson.dumps(top), compresslevel=6, mtime=0))
        total += p.stat().st_size
    return total


def _mb(b: float) -> str:
    return f"{b / 1e6:.2f} MB" if b >= 1e5 else f"{b / 1e3:.1f} kB"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", default="16,64", help="rank counts, comma-separated (default 16,64)")
    ap.add_argument("--nodes", type=int, default=2, help="Ray nodes of one CPU each (default 2)")
    ap.add_argument("--trace", type=Path, default=SOURCE, help="the real trace every rank is a copy of")
    ap.add_argument("--copies", type=int, default=1,
                    help="each rank: the trace's steps repeated this many times (benchmarks/diagnose_speed.py's "
                         "builder: each copy with its own ids and times), for rank files nearer a real deployment's")
    ap.add_argument("--link-gbps", type=float, default=10.0, help="link speed for the computed copy time")
    a = ap.parse_args()

    import ray
    from ray.cluster_utils import Cluster

    from perfscope.analysis.diagnose import diagnose
    from perfscope.cluster.ray_diagnose import diagnose_on_ray
    from perfscope.report.jsonout import dumps

    src = a.trace
    if a.copies > 1:
        sys.path.insert(0, str(REPO / "benchmarks"))
        from diagnose_speed import build_repeated_trace

        src = Path(tempfile.mkdtemp(prefix="perfscope-ray-bench-src-")) / f"x{a.copies}.json.gz"
        build_repeated_trace(a.trace, 0, src, a.copies)
    c = Cluster(initialize_head=True, connect=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    for _ in range(a.nodes):
        c.add_node(num_cpus=1)
    c.wait_for_nodes()
    print(f"trace {a.trace.name}{f' x{a.copies} steps' if a.copies > 1 else ''}; {a.nodes} Ray nodes of 1 CPU each on this machine ({os.cpu_count()} cores); "
          f"copy path: local copy + diagnose on {a.nodes} processes")
    try:
        for n in [int(x) for x in a.ranks.split(",") if x]:
            with tempfile.TemporaryDirectory(prefix="perfscope-ray-bench-") as tmp:
                prof = Path(tmp) / "on-nodes"
                size = make_ranks(src, n, prof)
                t0 = time.perf_counter()
                d_ray, run = diagnose_on_ray([prof])
                ray_s = time.perf_counter() - t0
                t0 = time.perf_counter()
                here = Path(tmp) / "copied"
                here.mkdir()
                moved = 0
                for f in sorted(prof.iterdir()):
                    shutil.copyfile(f, here / f.name)
                    moved += f.stat().st_size
                copy_s = time.perf_counter() - t0
                d_loc = diagnose([here], workers=a.nodes)
                local_s = time.perf_counter() - t0
                x, y = d_ray.to_dict(), d_loc.to_dict()
                x.pop("parallel"), y.pop("parallel")
                # the copies' folder differs (each rank's file and meta.path), nothing else may
                same = dumps(x).replace(str(prof).encode(), b"F") == dumps(y).replace(str(here).encode(), b"F")
                link_s = moved * 8 / (a.link_gbps * 1e9)
                print(f"{n} ranks ({_mb(size)} as gzip, {_mb(size / n)} each): "
                      f"wall ray {ray_s:.2f} s (its tasks {run.task_seconds:.2f} s over {a.nodes} nodes) / copy {local_s:.2f} s "
                      f"(copy {copy_s:.2f} s + diagnose) = "
                      f"{ray_s / local_s:.2f}x; "
                      f"bytes ray {_mb(run.moved_bytes)} / copy {_mb(moved)} = {run.moved_bytes / moved:.4f}x; "
                      f"copy over a {a.link_gbps:g} Gb/s link alone {link_s:.2f} s (computed); "
                      f"same diagnosis: {'yes' if same else 'NO'}")
                if not same:
                    return 1
    finally:
        ray.shutdown()
        c.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
