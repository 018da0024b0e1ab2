"""`diagnose --markdown FILE` (the summary pasted into an issue or PR) and `--csv DIR` (the
bucket, op and per-rank tables), on real traces, checked against the same run's --json."""

from __future__ import annotations

import csv
import json

import pytest

from clirun import invoke
from paths import H200, HTA

pytestmark = pytest.mark.shared_reads  # analyses of committed real traces share their reads (tests/realtraces.py)


def run(*args):
    return invoke("diagnose", *args)


def test_markdown_summary_and_csv_tables(tmp_path):
    md, folder = tmp_path / "sub" / "issue.md", tmp_path / "tables"
    r = run(H200 / "mla_pool_eager.json.xz", "--json", "--markdown", md, "--csv", folder)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    text = md.read_text()
    lines = text.splitlines()
    assert lines[0].startswith("### perfscope diagnose: NVIDIA H200, 5 decode steps")
    verdict = next(ln for ln in lines if ln.startswith("**Verdict"))
    f = d["findings"][0]
    assert "`fp8-kv-cast`" in verdict and "`perfscope fix fp8-kv-cast --trace " in verdict and " --apply`" in verdict
    assert f"~{f['predicted_step_ms_after_fix']:.2f} ms" in verdict and f"{f['ms_per_step']:.2f} ms per step" in verdict
    # the bucket table holds the JSON's numbers, in order
    rows = [ln.split("|")[1:-1] for ln in lines if ln.startswith("| ") and ln.count("|") == 4]
    rows = [[c.strip() for c in row] for row in rows if row[0].strip() in d["buckets"]]
    want = sorted(((b, v) for b, v in d["buckets"].items() if v["ms_per_step"] > 0), key=lambda kv: -kv[1]["ms_per_step"])
    assert [row[0] for row in rows] == [b for b, _ in want]
    assert [row[1] for row in rows] == [f"{v['ms_per_step']:.2f}" for _, v in want]
    assert "**Top ops**" in text and "| `unrolled_elementwise_kernel" in text and "fp8_e4m3" in text
    assert "**Findings**" in text and "1,006" in text and "GB/s" in text
    # CSV: the same buckets and ops, as plain numbers
    with open(folder / "buckets.csv") as fh:
        b = {row["bucket"]: row for row in csv.DictReader(fh)}
    assert abs(float(b["copy"]["ms_per_step"]) - d["buckets"]["copy"]["ms_per_step"]) < 1e-6
    assert abs(float(b["copy"]["share"]) - d["buckets"]["copy"]["share"]) < 1e-6
    with open(folder / "ops.csv") as fh:
        ops = list(csv.DictReader(fh))
    assert len(ops) == len(d["ops"]) and ops[0]["op"] == d["ops"][0]["short"]
    assert "fp8_e4m3" in ops[0]["launched_by"] and not (folder / "ranks.csv").exists()
    assert not [p for p in tmp_path.rglob("*") if p.name.startswith(".") or p.suffix == ".tmp"]


def test_csv_per_rank_table_and_bad_folder(tmp_path):
    ranks = [HTA / "trace_filter" / f"sampled_rank-{i}.json.xz" for i in (0, 1)]
    r = run(*ranks, "--csv", tmp_path / "t", "--markdown", tmp_path / "m.md")
    assert r.returncode == 0, r.stderr
    with open(tmp_path / "t" / "ranks.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert sorted(row["rank"] for row in rows) == ["0", "1"] and all(float(row["median_ms"]) > 0 for row in rows)
    assert "| rank | stage | steps | median ms |" in (tmp_path / "m.md").read_text()
    (tmp_path / "file").write_text("x")
    r = run(ranks[0], "--csv", tmp_path / "file")
    assert r.returncode == 2 and "not a folder" in r.stderr and "Traceback" not in r.stderr


def test_user_files_follow_the_umask(tmp_path):
    """--markdown, --csv and --html files (and a run folder's run.json) are written with the mode
    the umask gives, as the user's other tools write theirs (mkstemp's 0600 made the Markdown and
    CSV private while the HTML was shared); the umask is the user's: 027 gives 0640."""
    import os
    import stat

    from clirun import invoke
    from paths import H200

    def run(umask: int, sub: str) -> dict:
        out = tmp_path / sub
        out.mkdir()
        saved = os.umask(umask)  # the process's umask for the one call, then the test run's again
        try:
            r = invoke("diagnose", H200 / "mla_pool_graph.json.xz", "--markdown", out / "s.md", "--csv", out / "csv",
                       "--html", out / "r.html")
        finally:
            os.umask(saved)
        assert r.returncode == 0, r.stderr
        files = [out / "s.md", out / "r.html", *sorted((out / "csv").glob("*.csv"))]
        assert len(files) >= 4
        return {p.name: stat.S_IMODE(os.stat(p).st_mode) for p in files}

    assert set(run(0o022, "a").values()) == {0o644}
    assert set(run(0o027, "b").values()) == {0o640}
