""".ci/run runs README.md's two commands verbatim, each on a fresh clone in a fresh venv.

The extraction is checked against README.md itself (parsed here independently), then on README
variants in scratch git repositories where .ci/run is run for real (venvs, clones and all) with
commands that record where and how they ran, or fail."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from paths import REPO

CI_RUN = REPO / ".ci" / "run"


def readme_block(text: str, marker: str) -> list[str]:
    """The lines inside the fenced block that follows ``<!-- marker -->``."""
    lines = text.splitlines()
    i = next(n for n, ln in enumerate(lines) if f"<!-- {marker} -->" in ln)
    start = next(n for n in range(i + 1, len(lines)) if lines[n].strip().startswith("```"))
    assert all(not ln.strip() for ln in lines[i + 1:start]), "text between the marker and its fence"
    end = next(n for n in range(start + 1, len(lines)) if lines[n].strip().startswith("```"))
    return lines[start + 1:end]


def test_ci_run_extracts_exactly_the_readme_commands():
    text = (REPO / "README.md").read_text()
    main, tests = readme_block(text, "main-command"), readme_block(text, "test-command")
    assert main and tests
    r = subprocess.run(["bash", str(CI_RUN), "--print"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == main + tests
    # what a new user is told to run: the demo after installing, the suite after tests/install.sh
    assert main[-1].rstrip().endswith("perfscope demo") and "tests/install.sh" in tests[0]


# the speed gate's benchmark, standing in for benchmarks/diagnose_speed.py (the real one builds a 171 MB
# trace and takes minutes): it says where it ran and with what, and exits with the code it is given
FAKE_GATE = ('import os, sys\n'
             'print("gate", os.getcwd(), os.environ.get("VIRTUAL_ENV"), *sys.argv[1:], file=sys.stderr)\n'
             'sys.exit({rc})\n')


# the linters (.ci/lint) and the lowest-versions job (.ci/lowest), standing in for the real ones (an
# install and a test run each): they say where they ran and with what, and exit with the code given
FAKE_STEP = 'echo "{name} $(pwd) $VIRTUAL_ENV CI=$CI" >&2; exit {rc}\n'


def _repo(tmp_path: Path, readme: str, gate_rc: int = 0, lint_rc: int = 0, lowest_rc: int = 0) -> Path:
    root = tmp_path / "proj"
    (root / ".ci").mkdir(parents=True)
    (root / "benchmarks").mkdir()
    (root / "benchmarks" / "diagnose_speed.py").write_text(FAKE_GATE.format(rc=gate_rc))
    (root / ".ci" / "lint").write_text(FAKE_STEP.format(name="lint", rc=lint_rc))
    (root / ".ci" / "lowest").write_text(FAKE_STEP.format(name="lowest", rc=lowest_rc))
    shutil.copy(CI_RUN, root / ".ci" / "run")
    (root / "README.md").write_text(readme, newline="")
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", "x"]):
        subprocess.run(cmd, cwd=root, check=True, env=env)
    return root


def _ci(root: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "CI")}
    env["TMPDIR"] = str(root.parent)  # where .ci/run makes (and, on failure, keeps) its clones
    return subprocess.run(["bash", str(root / ".ci" / "run"), *args], cwd="/", capture_output=True, text=True,
                          timeout=300, env=env)


FAKE_DEMO = ('echo "main $(pwd) $VIRTUAL_ENV CI=$CI" >&2 && mkdir perfscope-demo-1 && '
             'echo x > perfscope-demo-1/compare.html && echo "{}" > perfscope-demo-1/demo.json')


def test_extraction_is_robust_to_crlf_blank_lines_and_indented_fences(tmp_path):
    readme = ("# x\r\n\r\n<!-- main-command -->\r\n\r\n  ```sh\r\nstep one &&\r\n  step two\r\n  ```\r\n"
              "text\r\n<!-- test-command -->\r\n```\r\nrun tests\r\n```\r\n")
    r = _ci(_repo(tmp_path, readme), "--print")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["step one &&", "  step two", "run tests"]
    # prose between the marker and the fence, or no fence: no command, exit 2, nothing run
    for bad in ("<!-- main-command -->\nsee below\n```\nx\n```\n<!-- test-command -->\n```\ny\n```\n",
                "<!-- main-command -->\n```\nx\n<!-- test-command -->\n"):
        r = _ci(_repo(tmp_path / str(len(bad)), bad), "--print")
        assert r.returncode == 2 and "no fenced command" in r.stderr, r


@pytest.mark.slow  # clones and venvs made for real (~60 s)
def test_both_commands_run_on_fresh_clones_in_fresh_venvs_and_failures_fail(tmp_path):
    readme = (f"<!-- main-command -->\n```\n{FAKE_DEMO}\n```\n"
              '<!-- test-command -->\n```\necho "tests $(pwd) $VIRTUAL_ENV" >&2 && test -f .venv/bin/python\n```\n')
    root = _repo(tmp_path, readme)
    r = _ci(root)
    assert r.returncode == 0, r.stderr
    lines = {ln.split()[0]: ln.split() for ln in r.stderr.splitlines()
             if ln.startswith(("main ", "tests ", "lint ", "lowest "))}
    main_dir, main_venv, ci = lines["main"][1:]
    test_dir, test_venv = lines["tests"][1:]
    # each ran from the root of its own clone (not the checkout), in that clone's own venv, CI=true
    assert main_dir != test_dir and str(root) not in (main_dir, test_dir)
    assert main_venv == main_dir + "/.venv" and test_venv == test_dir + "/.venv" and ci == "CI=true"
    assert not (root / ".venv").exists() and not list(root.glob("perfscope-demo-*"))
    # the speed gate ran after the tests, in the test clone with its venv, on the trace the benchmark
    # builds itself from the repository (no path: nothing beside the clone is read), checking
    gates = [ln.split() for ln in r.stderr.splitlines() if ln.startswith("gate ")]
    gate = gates[0]
    assert gate[1] == gate[2][:-len("/.venv")] and gate[1].endswith("/test/p")
    assert gate[3:6] == ["--only", "eager", "--check"]
    assert "--check" in gate and gate[gate.index("--gate") + 1] == "1.5"
    assert r.stderr.index("gate ") > r.stderr.index("tests ")
    # then the CUDA-graph trace, in the same clone, with its own gate (the same 1.5)
    assert len(gates) == 2 and gates[1][1:3] == gate[1:3]
    assert gates[1][3:6] == ["--only", "graph", "--check"] and gates[1][gates[1].index("--gate") + 1] == "1.5"
    # the linters ran in the test clone with its venv, after the tests and before the gates; the
    # lowest-versions job last, from the root of a clone of its own, with no venv of the others'
    lint = lines["lint"][1:]
    assert lint[:2] == [test_dir, test_venv] and r.stderr.index("tests ") < r.stderr.index("lint ") < \
        r.stderr.index("gate ")
    lowest = lines["lowest"][1:]
    assert lowest[0] not in (main_dir, test_dir, str(root)) and lowest[0].endswith("/lowest/p")
    assert lowest[1] == "CI=true" and r.stderr.index("lowest ") > r.stderr.rindex("gate ")

    # a failing main command fails CI (and the test command is not reached)
    r = _ci(_repo(tmp_path / "a", readme.replace(FAKE_DEMO, "false")))
    assert r.returncode == 1 and "main command failed" in r.stderr and "tests " not in r.stderr
    # a main command that leaves no demo folder fails CI
    r = _ci(_repo(tmp_path / "b", readme.replace(FAKE_DEMO, "true")))
    assert r.returncode == 1 and "perfscope-demo-" in r.stderr
    # a failing test command fails CI
    r = _ci(_repo(tmp_path / "c", readme.replace("test -f .venv/bin/python", "exit 5")))
    assert r.returncode == 1 and "test command failed" in r.stderr and "gate " not in r.stderr
    # a failing speed gate fails CI
    r = _ci(_repo(tmp_path / "d", readme, gate_rc=1))
    assert r.returncode == 1 and "speed gate failed" in r.stderr
    # failing linters fail CI (before the gates); so does a failing lowest-versions job
    r = _ci(_repo(tmp_path / "e", readme, lint_rc=1))
    assert r.returncode == 1 and "linters failed" in r.stderr and "gate " not in r.stderr
    r = _ci(_repo(tmp_path / "f", readme, lowest_rc=1))
    assert r.returncode == 1 and "lowest versions" in r.stderr


def test_nothing_skips_past_tests_need():
    """Under CI=true nothing skips: every test that may lack a binary, an engine or a module asks
    tests/need.py, which fails there. A direct pytest.skip / importorskip elsewhere would skip in CI."""
    import re

    tests = Path(__file__).resolve().parent
    direct = re.compile(r"pytest\.(skip\(|importorskip\(|mark\.skip\b|mark\.skipif\b)")
    found = [f"{p.name}:{i}" for p in sorted(tests.glob("*.py")) if p.name != "need.py"
             for i, line in enumerate(p.read_text().splitlines(), 1) if direct.search(line)
             and not line.lstrip().startswith("#") and "direct = re.compile" not in line]
    assert found == []
