"""The golden output of ``perfscope diagnose --json`` on every real trace and run folder in the
repository: what a change that means to keep behaviour (a restructuring) must leave byte for byte
as it was. tests/test_golden.py compares; a change that means to alter the output regenerates the
file and shows its diff in review:

    python tests/golden_snapshot.py --write      # rewrites tests/golden/diagnose.json.xz
    python tests/golden_snapshot.py --diff       # what differs now, input by input

Inputs: each trace of tests/traces (the corpus and the project's own folders) and tests/fixtures
alone, and each run folder of examples/gpu_loop/results (their bench and host-timing measurements
make the predictions). Normalised: the repository's path becomes ``<repo>``, the tool's version is
dropped; an input perfscope refuses keeps its one-line error."""

from __future__ import annotations

import argparse
import json
import lzma
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GOLDEN = REPO / "tests" / "golden" / "diagnose.json.xz"
_SUFFIXES = (".json.gz", ".json.xz")


def inputs() -> list[Path]:
    found = [p for p in sorted((REPO / "tests" / "traces").rglob("*")) if p.name.endswith(_SUFFIXES)]
    found += [p for p in sorted((REPO / "tests" / "fixtures").glob("*")) if p.name.endswith(_SUFFIXES)]
    results = REPO / "examples" / "gpu_loop" / "results"
    found += sorted(p.parent for p in results.rglob("run.json"))
    return found


def snapshot(path: Path) -> dict:
    """The normalised JSON of one input's diagnosis (or its error line)."""
    from perfscope.analysis.diagnose import diagnose
    from perfscope.errors import PerfscopeError

    try:
        d = diagnose([path], workers=1).to_dict()
    except PerfscopeError as e:
        d = {"error": str(e)}
    d.pop("tool", None)
    text = json.dumps(d, sort_keys=True, default=str).replace(str(REPO), "<repo>")
    return json.loads(text)


def current(progress=None) -> dict[str, dict]:
    out = {}
    for i, p in enumerate(inputs()):
        out[str(p.relative_to(REPO))] = snapshot(p)
        if progress:
            progress(i + 1)
    return out


def load() -> dict[str, dict]:
    return json.loads(lzma.decompress(GOLDEN.read_bytes()))


def differences(want: dict, got: dict, limit: int = 5) -> list[str]:
    """Human lines: inputs added or gone, and for a changed one its first differing keys."""
    lines = [f"new input (not in the golden file): {k}" for k in sorted(set(got) - set(want))]
    lines += [f"input gone: {k}" for k in sorted(set(want) - set(got))]
    for k in sorted(set(want) & set(got)):
        if want[k] != got[k]:
            lines.append(f"changed: {k}: " + "; ".join(_first_diffs(want[k], got[k], "", limit)))
    return lines


def _first_diffs(a, b, at: str, limit: int) -> list[str]:
    if type(a) is not type(b) or not isinstance(a, (dict, list)):
        return [f"{at or '.'}: {json.dumps(a)[:120]} -> {json.dumps(b)[:120]}"]
    out: list[str] = []
    if isinstance(a, dict):
        keys = sorted(set(a) | set(b))
        pairs = [(f"{at}.{k}", a.get(k), b.get(k)) for k in keys]
    else:
        if len(a) != len(b):
            return [f"{at}: {len(a)} items -> {len(b)}"]
        pairs = [(f"{at}[{i}]", x, y) for i, (x, y) in enumerate(zip(a, b))]
    for where, x, y in pairs:
        if x != y:
            out += _first_diffs(x, y, where, limit)
            if len(out) >= limit:
                break
    return out[:limit]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--write", action="store_true")
    ap.add_argument("--diff", action="store_true")
    a = ap.parse_args()
    sys.path.insert(0, str(REPO))
    got = current(lambda n: print(f"\r{n} inputs", end="", file=sys.stderr, flush=True))
    print(file=sys.stderr)
    if a.write:
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        tmp = GOLDEN.with_suffix(".tmp")
        tmp.write_bytes(lzma.compress(json.dumps(got, sort_keys=True, indent=0).encode(), preset=6))
        tmp.replace(GOLDEN)
        print(f"wrote {GOLDEN.relative_to(REPO)}: {len(got)} inputs")
        return 0
    lines = differences(load(), got)
    print("\n".join(lines) or "no difference")
    return 1 if lines else 0


if __name__ == "__main__":
    raise SystemExit(main())
