"""Print pip requirements that pin each lower bound pyproject.toml states: `NAME==LOWER` for every
`NAME>=LOWER` of the package's dependencies and of the `test` extra's tools that the fast tests use.

    python .ci/lowest_bounds.py > lowest.txt && pip install -r lowest.txt -e .

.ci/run installs these in a fresh venv and runs `pytest -m "not slow"` there, so a bound the code
has outgrown (an API it imports that the lowest allowed release lacks) fails CI. The `test` extra's
heavy optional tools (triton, ray, playwright) and the linters are left out: the tests that need them
are slow-marked or skip without them, and they run at their current releases in the main test job.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

SKIP = {"triton", "ray", "playwright", "ruff", "mypy", "import-linter"}  # the linters run in the main test venv
REQ = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9_.-]*)\s*>=\s*([^,;\s]+)\s*(;.*)?$")


def lowest(pyproject: Path) -> list[str]:
    project = tomllib.loads(pyproject.read_text())["project"]
    out = []
    for req in project["dependencies"] + project["optional-dependencies"]["test"]:
        m = REQ.match(req)
        if m is None:
            if "==" in req:
                continue  # already exact
            sys.exit(f"lowest_bounds.py: no lower bound in {req!r} (state one as NAME>=VERSION)")
        name, version, marker = m.groups()
        if name.lower() not in SKIP:
            out.append(f"{name}=={version}{' ' + marker if marker else ''}")
    return out


if __name__ == "__main__":
    print("\n".join(lowest(Path(__file__).resolve().parent.parent / "pyproject.toml")))
