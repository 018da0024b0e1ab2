"""``diagnose --ray`` on a real Ray cluster of several nodes on this machine (Ray's own test cluster,
``ray.cluster_utils.Cluster``): each rank analysed on the node that holds it, the result byte for byte
the local run's (its ``parallel`` object aside, which says how the files were analysed), a node killed
before and during the run, a rank file missing on its node. Nothing is mocked.

The nodes share this machine's file system, so every node holds every file of a plain profile folder
(as on a shared file system); the run-folder tests place ranks by host instead: each node carries a
``perfscope-host`` label and run.json names each file's host."""

from __future__ import annotations

import gzip
import json
import lzma
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import need
from clirun import run
from paths import GPU_LOOP, HTA

ray = need.module("ray")

from perfscope.analysis.diagnose import diagnose  # noqa: E402
from perfscope.cluster import ray_diagnose as rd  # noqa: E402
from perfscope.errors import InputError  # noqa: E402
from perfscope.report.jsonout import dumps  # noqa: E402
from perfscope.rundir import write_run  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]  # a Ray cluster of several nodes on this machine

SAMPLED = HTA / "trace_filter"  # two real ranks of one NCCL job (sampled_rank-0/1: steps, all-reduces)


def _rank_trace(r: int) -> bytes:
    """A real rank trace as gzip, rank ``r`` (ranks 2, 3, ... are the two real ones again with their
    distributedInfo rank made ``r``: distinct bytes, so not analysed once as copies)."""
    b = lzma.open(SAMPLED / f"sampled_rank-{r % 2}.json.xz").read()
    b = b.replace(b'"rank": %d,' % (r % 2), b'"rank": %d,' % r, 1)
    return gzip.compress(b, mtime=0)


def _profile(d: Path, n: int) -> Path:
    """An SGLang profile folder of ``n`` ranks (``...-TP-{r}.trace.json.gz``)."""
    d.mkdir(parents=True)
    for r in range(n):
        (d / f"1790000000.1-TP-{r}.trace.json.gz").write_bytes(_rank_trace(r))
    return d


def _run_folder(d: Path, hosts: list[str]) -> Path:
    """A run folder whose run.json names each rank's host (rank r on hosts[r])."""
    (d / "traces").mkdir(parents=True)
    files = []
    for r, h in enumerate(hosts):
        rel = f"traces/1790000000.1-TP-{r}.trace.json.gz"
        (d / rel).write_bytes(_rank_trace(r))
        files.append({"path": rel, "host": h})
    write_run(d, command=["perfscope", "trace"], hosts=sorted(set(hosts)), files=files)
    return d


def _same(ray_d, local_d) -> None:
    a, b = ray_d.to_dict(), local_d.to_dict()
    assert a.pop("parallel")["bound"] == "ray"
    b.pop("parallel")
    assert dumps(a) == dumps(b)


@pytest.fixture(scope="module")
def cluster():
    """A head without CPUs (it runs no rank) and two nodes of one CPU each, labelled hosts a and b."""
    from ray.cluster_utils import Cluster

    # a node killed in a test is found dead within ~2 s (Ray's default health check: ~15 s)
    c = Cluster(initialize_head=True, connect=True,
                head_node_args={"num_cpus": 0, "include_dashboard": False,
                                "_system_config": {"health_check_period_ms": 500, "health_check_failure_threshold": 3,
                                                   "health_check_initial_delay_ms": 0}})
    nodes = {h: c.add_node(num_cpus=1, labels={rd.HOST_LABEL: h}) for h in ("a", "b")}
    c.wait_for_nodes()
    yield c, nodes
    ray.shutdown()
    c.shutdown()


def _node_names(run) -> set[str]:
    return {v.split(" ")[0] for v in run.placement.values()}


def test_ranks_spread_over_nodes_equal_the_local_run(cluster, tmp_path):
    prof = _profile(tmp_path / "prof", 4)
    done = []
    d, run = rd.diagnose_on_ray([prof], on_done=lambda k, n: done.append((k, n)))
    _same(d, diagnose([prof]))
    assert done[-1] == (4, 4) and [k for k, _ in done] == [1, 2, 3, 4]  # streamed, one result at a time
    assert _node_names(run) == {"a", "b"}, run.placement  # both nodes analysed ranks
    assert d.parallel == {"files": 4, "workers": 2, "bound": "ray"}
    assert not run.retried and not run.missing
    # only the results came back: no trace byte (the arguments and results are smaller than the files)
    assert 0 < run.moved_bytes < run.trace_bytes
    assert len(d.ranks) == 4 and d.straggler is not None


def test_run_folder_host_pins_each_rank_to_its_node(cluster, tmp_path):
    run_dir = _run_folder(tmp_path / "run", ["a", "b", "b", "a"])
    d, run = rd.diagnose_on_ray([run_dir])
    _same(d, diagnose([run_dir]))
    where = {Path(p).name.split("-TP-")[1].split(".")[0]: v.split(" ")[0] for p, v in run.placement.items()}
    assert where == {"0": "a", "1": "b", "2": "b", "3": "a"}
    assert [r.meta["host"] for r in d.ranks] == ["a", "a", "b", "b"]


def test_run_folder_with_host_timing_and_bench(cluster):
    """A real H200 run folder (SGLang, DECODE and EXTEND files, its GPU-only host-timing profile and its
    bench): the host timing is read on a node, the diagnosis (predictions included) is the local one."""
    run_dir = GPU_LOOP / "h200-2026-12-02-predict/dense-495000-c1/bug"
    assert (run_dir / "host-timing/run.json").is_file()
    d, _ = rd.diagnose_on_ray([run_dir])
    local = diagnose([run_dir])
    _same(d, local)
    assert [f for f in d.primary.findings if f.id == "fp8-kv-cast"]


def test_cli_json_is_the_local_json(cluster, tmp_path):
    c, _ = cluster
    prof = _profile(tmp_path / "prof", 2)
    env = dict(os.environ, PYTHONWARNINGS="ignore")

    def cli(*argv):  # a process of its own: Ray's client state and logging are the subject
        return run("diagnose", *argv, env=env)

    r = cli(str(prof), "--ray", c.address, "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    local = cli(str(prof), "--json")
    a, b = json.loads(r.stdout), json.loads(local.stdout)
    assert a.pop("parallel")["bound"] == "ray"
    b.pop("parallel")
    assert dumps(a) == dumps(b)
    assert r.stderr.strip() == ""  # Ray's own logging stays quiet
    # --ray right before a path (not an address): the cluster this machine is part of
    r = cli("--ray", str(tmp_path / "nowhere"), "--json")
    assert r.returncode in (2, 3), r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_a_rank_file_missing_on_its_node_is_one_line(cluster, tmp_path):
    c, _ = cluster
    prof = _profile(tmp_path / "prof", 2)
    planned = rd.plan(ray, [prof])
    (prof / "1790000000.1-TP-1.trace.json.gz").unlink()  # gone between the survey and its task
    with pytest.raises(InputError) as e:
        rd.diagnose_on_ray([prof], planned=planned)
    msg = str(e.value)
    assert "TP-1" in msg and "on node" in msg and "\n" not in msg
    # a run folder whose run.json lists a file no node has: the CLI says so in one line, exit 2
    run_dir = _run_folder(tmp_path / "run", ["a", "b"])
    (run_dir / "traces/1790000000.1-TP-1.trace.json.gz").unlink()
    r = run("diagnose", run_dir, "--ray", c.address)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "TP-1" in lines[0] and "missing" in lines[0] and "Ray node" in lines[0], lines


def _extra_node(c, label: str):
    n = c.add_node(num_cpus=1, labels={rd.HOST_LABEL: label})
    c.wait_for_nodes()
    return n


def test_node_killed_after_the_survey(cluster, tmp_path):
    """A node that dies before its ranks ran: each is retried on another node holding its file; a
    rank the run folder places on that node's host is reported missing in one line."""
    c, _ = cluster
    prof = _profile(tmp_path / "prof", 6)
    node = _extra_node(c, "c")
    planned = rd.plan(ray, [prof])
    on_c = [j for j in planned.jobs if planned.nodes[j.node].labels.get(rd.HOST_LABEL) == "c"]
    assert on_c  # the survey spread the ranks over a, b and c
    c.remove_node(node, allow_graceful=False)
    t0 = time.monotonic()
    d, run = rd.diagnose_on_ray([prof], planned=planned)
    assert time.monotonic() - t0 < 120
    _same(d, diagnose([prof]))
    assert len(run.retried) == len(on_c) and not run.missing
    assert all("retried on node" in line and "\n" not in line for line in run.retried)
    assert "c" not in _node_names(run)

    run_dir = _run_folder(tmp_path / "run", ["a", "b", "c"])
    node = _extra_node(c, "c")
    planned = rd.plan(ray, [run_dir])
    c.remove_node(node, allow_graceful=False)
    d, run = rd.diagnose_on_ray([run_dir], planned=planned)
    assert [r.rank for r in d.ranks] == [0, 1]
    assert len(run.missing) == 1 and "rank 2" in run.missing[0] and "missing" in run.missing[0]
    assert run.missing[0] in d.warnings


def test_node_killed_mid_run(cluster, tmp_path):
    """A node killed while its ranks are being analysed: the run ends (no hang) with every rank, its
    lost ones retried on the other nodes, and the local run's result."""
    c, _ = cluster
    prof = _profile(tmp_path / "prof", 6)
    node = _extra_node(c, "c")
    killed = threading.Event()

    def on_done(k, n):
        if not killed.is_set():
            killed.set()
            c.remove_node(node, allow_graceful=False)

    t0 = time.monotonic()
    d, run = rd.diagnose_on_ray([prof], on_done=on_done)
    assert killed.is_set() and time.monotonic() - t0 < 180
    _same(d, diagnose([prof]))
    assert not run.missing
    assert run.retried and all("lost on node c" in line for line in run.retried)


def test_ray_not_installed_is_one_line(tmp_path):
    # Ray is installed here: the import is made to fail as it does without it (sys.modules entry None)
    prof = _profile(tmp_path / "prof", 1)
    code = ("import sys; sys.modules['ray'] = None; from perfscope.cli import main; "
            f"sys.argv = ['perfscope', 'diagnose', {str(prof)!r}, '--ray']; main()")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [r.stderr.strip()]
    assert "pip install 'perfscope[ray]'" in r.stderr
