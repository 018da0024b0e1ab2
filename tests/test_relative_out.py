"""Every command that writes takes its output path as a user types it: relative to the working
directory (`--out run1`, the README's own example) or under `~`. Run for real, as a user would,
from a scratch working directory against the real reproduction server (the one
tests/test_fix_restart.py restarts), with HOME pointed at a scratch folder for `~`.

The demo's default folder (`./perfscope-demo-<time>`, no --out) is covered by tests/test_demo.py,
which runs the demo from a scratch working directory without --out."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

import need
from clirun import run

from perfscope import rundir
from test_fix_restart import BENCH, MARKER, site  # noqa: F401  (the fixture: a restartable repro server)

pytestmark = pytest.mark.slow  # the reproduction server (test_fix_restart's `site`)

need.module("torch")

LOAD = ["--steps", "3", "--input-len", "16", "--output-len", "12", "--timeout", "120"]


def _run(cwd: Path, home: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, "HOME": str(home)}
    return run(*args, env=env, cwd=cwd, timeout=timeout)


def test_relative_and_home_paths_in_every_writing_command(site, tmp_path):  # noqa: F811
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()

    # trace --out run1 (relative): a complete run folder in the working directory, nothing nested
    r = _run(work, home, "trace", "--url", site.url, *LOAD, "--out", "run1", "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout)["run_dir"] == str(work / "run1")
    info = rundir.read_run(work / "run1", verify=True)
    assert info.files and not (work / "run1" / "run1").exists()
    # bench --out run1: added to that run folder
    r = _run(work, home, "bench", "--url", site.url, "--input-len", "16", "--output-len", "4",
             "--num-requests", "1", "--warmup", "0", "--out", "run1", "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout)["bench_file"] == str(work / "run1" / "bench.json")
    assert rundir.read_run(work / "run1").timings["bench"]["tpot_ms"] > 0

    # '~' as the shell would not expand it (--out=~/...): HOME's folder, not a folder named '~'
    r = _run(work, home, "trace", "--url", site.url, *LOAD, "--out=~/runs/r2", "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    assert rundir.read_run(home / "runs" / "r2", verify=True).files and not (work / "~").exists()

    # the readers' writers: diagnose --html, report -o, compare --html, relative and '~'
    r = _run(work, home, "diagnose", "run1", "--html", "d.html", "--markdown", "~/d.md", "--csv", "tables")
    assert r.returncode == 0, r.stderr[-3000:]
    assert (home / "d.md").read_text().startswith("### perfscope diagnose") and (work / "tables" / "ops.csv").is_file()
    r = _run(work, home, "report", "run1", "-o", "~/rep.html")
    assert r.returncode == 0, r.stderr[-3000:]
    r = _run(work, home, "compare", "run1", str(home / "runs" / "r2"), "--html", "sub/c.html")
    assert r.returncode == 0, r.stderr[-3000:]
    for p in (work / "d.html", home / "rep.html", work / "sub" / "c.html"):
        assert p.stat().st_size > 50_000, p

    # fix --apply --restart-cmd --out fix1 (relative): before/after and the records land in ./fix1
    r = _run(work, home, "fix", "fp8-kv-cast", "--target-file", str(site.target), "--url", site.url,
             "--port", str(site.port), "--state-dir", str(site.state), "--apply",
             "--restart-cmd", f"sh {site.script} ok", "--health-timeout", "60", "--out", "fix1", "--json", *BENCH)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout)["run_dir"] == str(work / "fix1")
    assert {"before", "after", "restart.json", "fix.json"} <= {p.name for p in (work / "fix1").iterdir()}
    assert MARKER in site.target.read_bytes()
    assert sorted(p.name for p in work.iterdir()) == ["d.html", "fix1", "run1", "sub", "tables"]
