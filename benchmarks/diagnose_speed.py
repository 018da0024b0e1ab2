#!/usr/bin/env python
"""CPU time and memory of `perfscope diagnose`, as ratios to a floor measured in the same run.

    python benchmarks/diagnose_speed.py [TRACE] [--graph-mb 50] [--growth] [--ranks 8,16] [--rounds 2]
                                        [--check] [--gate 1.5] [--readme] [--only eager|graph]

The floor is `orjson.loads(gzip.open(f).read())` of the same file: reading the JSON at all. Every
measurement runs in a fresh child process (its CPU time is user+sys of that child and its
children, its peak RSS its own) and the children alternate (floor, perfscope, floor, ...) so a
loaded machine slows both; each figure is the minimum over the rounds. CPU time, not wall time:
on a shared box wall time measures the neighbours. perfscope's modules are byte-compiled first (as
an installed package's are), so no child spends its time compiling perfscope's source. Printed,
each with its target:

  - eager:  diagnose of TRACE / the floor                               (target <= 1.0)
            the reader alone (perfscope.load.load_trace) / the floor   (target <= 0.75)
            peak RSS / the JSON size, of diagnose and of the reader    (target <= 1.5)
  - graph:  the same for a CUDA-graph decode trace of about --graph-mb MB of JSON, built from the
            real H200 graph trace (mla_pool_graph.json.xz): its events repeated, each copy shifted
            in time and in its correlation / external / Python ids (Kineto's own layout, more steps)
  - growth: with several --graph-mb sizes (--growth: 50, 200 and 1000 MB), diagnose's CPU time per
            event and its ratio to the floor at each size: flat when diagnose grows linearly
  - HTA and TraceLens on each trace beside it, when installed (perfscope's CPU time / theirs): HTA's
            TraceAnalysis(trace_dir).get_gpu_kernel_breakdown(), TraceLens'
            TreePerfAnalyzer.from_file(f).get_df_kernel_launchers(). Both pull in pandas and more: install
            them in a venv of their own beside perfscope (`pip install -e .[test] HolisticTraceAnalysis`;
            TraceLens from its repository, github.com/AMD-AGI/TraceLens: `pip install --no-deps <its
            checkout>` and `pip install pandas tqdm tabulate openpyxl`) and run this script with that venv
  - ranks:  for each N of --ranks (8 and 16), N rank files on this box's C cores: distinct ranks of
            the (first) CUDA-graph trace, each with its own rank (distributedInfo), GPU and process
            ids, so that perfscope reads N ranks, not one file N times (it reads byte-identical files
            as one); wall time against ceil(N / C) x one rank             (target <= 1.1)
            and the worker pool's peak RSS (its workers, each at most the largest process's peak,
            and the parent) against the memory the box has available: it must not swap

--check exits 1 when diagnose's CPU-time ratio on TRACE exceeds --gate (1.5: a gate against
regressions, loose enough for a loaded CI box). --readme rewrites README.md's speed paragraph
(between its ``speed-benchmark`` markers) with the lines printed here. --only eager measures TRACE
alone (what CI runs); --only graph the CUDA-graph trace(s) of --graph-mb alone, and --check then
gates each graph trace's ratio instead; --only ranks the rank lines alone. HTA and TraceLens run on
the eager trace and the first CUDA-graph trace only, and not under --check (a gate times perfscope).
Default TRACE: built in a temporary folder from the real H200 eager trace in the repository
(tests/traces/corpus/h200-mla-fp8-kv/mla_pool_eager.json.xz, 5 decode steps of 60 MLA layers with
CPU ops, shapes and stacks): its events repeated as for the graph trace, 24 copies (120 steps,
about 171 MB of JSON as orjson writes it; the profiler's own spacing made a 120-step original of
210 MB), written as gzip like a profiler's output.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parents[1]
TRACES = REPO / "tests" / "traces" / "corpus" / "h200-mla-fp8-kv"
EAGER_SOURCE = TRACES / "mla_pool_eager.json.xz"
EAGER_MB = 210.0
EAGER_COPIES = 24  # 5 steps each: 120 decode steps
EAGER_NAME = "mla_pool_eager_x120steps.json.gz"
GRAPH_SOURCE = TRACES / "mla_pool_graph.json.xz"
README = REPO / "README.md"
BEGIN, END = "<!-- speed-benchmark:begin -->", "<!-- speed-benchmark:end -->"
GATE = 1.5

# the README lines, one format each (tests/test_speed_readme.py holds README to them)
LINE_FORMATS = {
    "eager": "- eager, {name} ({mb:.0f} MB of JSON): diagnose {cpu:.2f} s CPU = {ratio:.2f}x the orjson floor "
             "({floor:.2f} s); reader {reader:.2f}x; peak RSS {rss:.2f}x the JSON size",
    "graph": "- CUDA graphs, {name} ({mb:.0f} MB of JSON): diagnose {cpu:.2f} s CPU = {ratio:.2f}x the orjson "
             "floor ({floor:.2f} s); reader {reader:.2f}x; peak RSS {rss:.2f}x the JSON size",
    "peer": "- {peer} on the {kind} trace: {cpu:.2f} s CPU; perfscope uses {ratio:.2f}x its CPU time",
    "ranks": "- {n:d} rank files on {cores:d} cores: {wall:.2f} s wall = {ratio:.2f}x ceil({n:d}/{cores:d}) x one rank "
             "({one:.2f} s)",
    "growth": "- growth, CUDA graphs at {mb:.0f} MB of JSON ({events:d} events): diagnose {us:.2f} us CPU per event, "
              "{ratio:.2f}x the orjson floor",
}
NUM = r"[0-9]+(?:\.[0-9]+)?"


def line_regex(kind: str) -> re.Pattern:
    """The README line of ``kind`` as a regex: its numbers as named groups, the rest literal."""
    fmt = LINE_FORMATS[kind]
    out, pos, seen = "", 0, set()
    for m in re.finditer(r"\{(\w+)(:[^}]*)?\}", fmt):
        out += re.escape(fmt[pos:m.start()])
        name, spec = m.group(1), m.group(2) or ""
        if name in seen:
            out += f"(?P={name})"  # the same value again
        else:
            out += (f"(?P<{name}>{NUM})" if spec.endswith("f") else f"(?P<{name}>[0-9]+)" if spec.endswith("d")
                    else f"(?P<{name}>[^()]+?)")
        seen.add(name)
        pos = m.end()
    return re.compile(out + re.escape(fmt[pos:]) + "$")


# ---------------------------------------------------------------------------------------------- children

def child(kind: str, paths: list[str]) -> None:
    """One measurement in this (fresh) process: prints its peak RSS (CPU time is the parent's to read)."""
    if kind == "build":
        src, out, copies, mb = paths
        print(build_repeated_trace(Path(src), float(mb), Path(out), int(copies) or None))
        return
    if kind == "ranks":
        src, n, folder = paths
        rank_files(Path(src), int(n), Path(folder))
        return
    if kind == "orjson":
        import orjson

        for p in paths:
            with gzip.open(p) as f:
                orjson.loads(f.read())
    elif kind == "reader":
        from perfscope.load import load_trace

        for p in paths:
            load_trace(p)
    elif kind == "hta":
        from hta.trace_analysis import TraceAnalysis

        d = tempfile.mkdtemp()
        try:
            os.symlink(os.path.abspath(paths[0]), os.path.join(d, "rank-0.json.gz"))
            TraceAnalysis(trace_dir=d).get_gpu_kernel_breakdown()
        finally:
            shutil.rmtree(d, ignore_errors=True)
    elif kind == "tracelens":
        from TraceLens import TreePerfAnalyzer

        TreePerfAnalyzer.from_file(paths[0]).get_df_kernel_launchers()
    else:
        from perfscope.cli import main

        sys.stdout = open(os.devnull, "w")
        try:
            main(["diagnose", *paths, "--json"])
        except SystemExit as e:
            if e.code not in (0, None):
                raise
        finally:
            sys.stdout = sys.__stdout__
    # this process image's own peak (VmHWM): getrusage's RUSAGE_SELF would carry the forking parent's
    # peak over through exec (Linux keeps it), and the parent may have built a large trace
    with open("/proc/self/status") as f:
        hwm = next(int(ln.split()[1]) for ln in f if ln.startswith("VmHWM:"))
    peak_kb = max(hwm, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
    print(json.dumps({"rss_mb": peak_kb * 1024 / 1e6}))


def measure(kind: str, paths: list[str]) -> dict:
    """{cpu: user+sys s of the child and its children, wall: s, rss_mb} of one fresh child."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, __file__, "--child", kind, *paths], capture_output=True, text=True,
                         cwd=REPO)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode != 0:
        raise RuntimeError(f"{kind} failed: {(out.stderr.strip().splitlines() or ['?'])[-1]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"cpu": cpu, "wall": wall, **json.loads(out.stdout.strip().splitlines()[-1])}


def best(kind: str, paths: list[str], rounds: int, floor: list | None = None) -> dict:
    """The fastest of ``rounds`` runs (min CPU, min wall, max RSS); ``floor`` collects orjson runs
    interleaved with these."""
    runs = []
    for _ in range(rounds):
        if floor is not None:
            floor.append(measure("orjson", paths))
        runs.append(measure(kind, paths))
    return {"cpu": min(r["cpu"] for r in runs), "wall": min(r["wall"] for r in runs),
            "rss_mb": max(r["rss_mb"] for r in runs)}


def installed(module: str) -> bool:
    return subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True).returncode == 0


# ---------------------------------------------------------------------------------------------- traces

def json_mb(path: Path) -> float:
    """The trace's JSON size in MB (10^6 bytes, as the sizes in README and the issues are given)."""
    with gzip.open(path) as f:
        return sum(len(b) for b in iter(lambda: f.read(1 << 24), b"")) / 1e6


def build_repeated_trace(src: Path, target_mb: float, out: Path, copies: Optional[int] = None) -> int:
    """A decode trace of about ``target_mb`` MB of JSON (or of ``copies`` copies), as gzip: ``src``'s
    events (a real trace, .json.gz or .json.xz) repeated, each copy after the last in time, with its
    correlation, external and Python ids (and flow ids) offset past the previous copy's, so every copy
    is events of its own (its own launches, kernels, steps). Returns the number of events."""
    import orjson

    from perfscope.load.reader import read_bytes

    top = orjson.loads(read_bytes(src))
    events = top["traceEvents"]
    t_lo = min(e["ts"] for e in events if "ts" in e)
    t_hi = max(e["ts"] + e.get("dur", 0) for e in events if "ts" in e)
    span = (t_hi - t_lo) * 1.01 + 1000.0
    id_keys = ("correlation", "External id", "Python id", "Python parent id")
    top_id = 1 + max([abs(int(v)) for e in events for k, v in (e.get("args") or {}).items()
                      if k in id_keys and isinstance(v, int)] +
                     [abs(int(e["id"])) for e in events if isinstance(e.get("id"), int)] + [0])
    copies = copies or max(1, math.ceil(target_mb * 1e6 / len(orjson.dumps(top))))  # written as orjson writes it
    keys = list(top)
    at = keys.index("traceEvents")
    before = orjson.dumps({k: top[k] for k in keys[:at]})[:-1]  # '{"schemaVersion":1,...'
    after = orjson.dumps({k: top[k] for k in keys[at + 1:]})[1:]  # '"traceName":"..."}'
    n = 0
    # written a copy at a time (the bytes orjson.dumps(top) of all copies would be): a 1 GB trace is
    # never whole in this process
    with gzip.open(out, "wb", compresslevel=1) as f:
        f.write(before + (b',"traceEvents":[' if len(before) > 1 else b'"traceEvents":['))
        for c in range(copies):
            out_events = []
            for e in events:
                if c == 0 or e.get("ph") == "M":
                    if c == 0:
                        out_events.append(e)
                    continue
                e = dict(e)
                if "ts" in e:
                    e["ts"] = e["ts"] + c * span
                if isinstance(e.get("id"), int):
                    e["id"] = e["id"] + c * top_id
                a = e.get("args")
                if a:
                    a = dict(a)
                    for k in id_keys:
                        if isinstance(a.get(k), int) and a[k] >= 0:
                            a[k] = a[k] + c * top_id
                    e["args"] = a
                out_events.append(e)
            if out_events:
                f.write((b"," if n else b"") + orjson.dumps(out_events)[1:-1])
                n += len(out_events)
        f.write(b"]" + (b"," + after if len(after) > 1 else b"}"))
    return n


def build_in_child(src: Path, out: Path, copies: Optional[int] = None, mb: float = EAGER_MB) -> int:
    """:func:`build_repeated_trace` in a child process: the benchmark's own process stays small (the
    children it measures are forked from it)."""
    r = subprocess.run([sys.executable, __file__, "--child", "build", str(src), str(out), str(copies or 0), str(mb)],
                       capture_output=True, text=True, check=True)
    return int(r.stdout.strip().splitlines()[-1])


def rank_files(src: Path, n: int, folder: Path) -> list[Path]:
    """``n`` rank files of ``src``'s events, as a TP group's profiler writes them: ``1-TP-<r>`` names,
    each with its own rank in ``distributedInfo`` (world size ``n``), its own GPU (the GPU events' device
    and process id) and its own host process ids (CPU events' ``pid`` + r), so no two are the same bytes
    (perfscope reads byte-identical files as one) and each reads as a rank of its own."""
    import orjson

    from perfscope.load.reader import read_bytes

    top = orjson.loads(read_bytes(src))
    events = top["traceEvents"]
    gpu = {e["pid"] for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation")
           and isinstance(e.get("pid"), int)}
    files = []
    for r in range(n):
        def one(e: dict, r: int = r) -> dict:
            pid = e.get("pid")
            if not isinstance(pid, int):
                return e
            e = dict(e)
            if pid in gpu:
                e["pid"] = r
                a = e.get("args")
                if isinstance(a, dict) and "device" in a:
                    e["args"] = {**a, "device": r}
            else:
                e["pid"] = pid + r
            return e

        dist = top.get("distributedInfo")
        dist = {**(dist if isinstance(dist, dict) else {}), "rank": r, "world_size": n}
        p = folder / f"1-TP-{r}.trace.json.gz"
        with gzip.open(p, "wb", compresslevel=1) as f:
            f.write(orjson.dumps({**top, "distributedInfo": dist, "traceEvents": [one(e) for e in events]}))
        files.append(p)
    return files


def ranks_in_child(src: Path, n: int, folder: Path) -> list[Path]:
    """:func:`rank_files` in a child process (the benchmark's own process stays small)."""
    subprocess.run([sys.executable, __file__, "--child", "ranks", str(src), str(n), str(folder)],
                   capture_output=True, text=True, check=True)
    return [folder / f"1-TP-{r}.trace.json.gz" for r in range(n)]


# ---------------------------------------------------------------------------------------------- report

def trace_lines(kind: str, path: Path, rounds: int, mb: float, peers: bool = True) -> tuple[list[str], dict]:
    floor: list = []
    ours = best("perfscope", [str(path)], rounds, floor)
    reader = best("reader", [str(path)], rounds, floor)
    fl = min(r["cpu"] for r in floor)
    res = {"name": path.name, "mb": mb, "cpu": ours["cpu"], "floor": fl, "ratio": ours["cpu"] / fl,
           "reader": reader["cpu"] / fl, "rss": ours["rss_mb"] / mb, "rss_mb": ours["rss_mb"],
           "wall": ours["wall"]}
    lines = [LINE_FORMATS[kind].format(**res)]
    print(f"{kind:6s} {path.name}: {mb:.0f} MB of JSON; orjson floor {fl:.2f} s CPU; perfscope diagnose "
          f"{ours['cpu']:.2f} s CPU ({ours['wall']:.2f} s wall), ratio {res['ratio']:.2f}x (target <= 1.0); "
          f"reader {reader['cpu']:.2f} s, {res['reader']:.2f}x (target <= 0.75); peak RSS {ours['rss_mb']:.0f} MB, "
          f"{res['rss']:.2f}x the JSON (target <= 1.5)", flush=True)
    print(f"memory {path.name}: peak RSS / JSON size: diagnose {res['rss']:.2f}x ({ours['rss_mb']:.0f} MB), the reader "
          f"alone {reader['rss_mb'] / mb:.2f}x ({reader['rss_mb']:.0f} MB), for {mb:.0f} MB of JSON (target <= 1.5)",
          flush=True)
    for peer, module in (("HTA", "hta"), ("TraceLens", "TraceLens")) if peers else ():
        if not installed(module):
            print(f"{kind:6s} {peer}: not installed (its module `{module}` does not import here)")
            continue
        try:
            theirs = best(peer.lower(), [str(path)], 1)
        except RuntimeError as e:
            print(f"{kind:6s} {peer}: {e}")
            continue
        r = ours["cpu"] / theirs["cpu"]
        lines.append(LINE_FORMATS["peer"].format(peer=peer, kind=kind, cpu=theirs["cpu"], ratio=r))
        print(f"{kind:6s} {peer}: {theirs['cpu']:.2f} s CPU, peak RSS {theirs['rss_mb']:.0f} MB; perfscope / {peer} "
              f"{r:.2f}x (target < 1.0)", flush=True)
    return lines, res


def rank_lines(trace: Path, counts: list[int], rounds: int) -> list[str]:
    """For each N in ``counts``: N distinct rank files of ``trace`` (:func:`rank_files`) diagnosed together,
    wall time against ceil(N / cores) x one rank's; and the pool's memory against what the box has free."""
    from perfscope.analysis.parallel import available_memory, json_bytes, plan_workers

    cores = os.cpu_count() or 1
    lines = []
    with tempfile.TemporaryDirectory() as d:
        one_dir = Path(d) / "one"
        one_dir.mkdir()
        single = ranks_in_child(trace, 1, one_dir)[0]
        ones = [measure("perfscope", [str(single)]) for _ in range(rounds)]
        one = min(r["wall"] for r in ones)
        for n in counts:
            many = Path(d) / f"ranks{n}"
            many.mkdir()
            files = ranks_in_child(trace, n, many)
            free = available_memory()
            workers, bound = plan_workers([json_bytes(f) for f in files], cores, free)
            alls = [measure("perfscope", [str(many)]) for _ in range(rounds)]
            shutil.rmtree(many, ignore_errors=True)
            all_ = min(r["wall"] for r in alls)
            ideal = math.ceil(n / cores) * one
            cpu = min(r["cpu"] for r in alls) / (n * min(r["cpu"] for r in ones))
            # the pool's peak: its workers at once, each at most the largest process's peak (the parent's own
            # is in that maximum too: it is counted once more, a margin)
            worker_mb = max(r["rss_mb"] for r in alls)
            pool_mb = (workers + 1) * worker_mb
            fits = "fits" if free is None or pool_mb * 1e6 <= free else "DOES NOT FIT (it would swap)"
            print(f"ranks  {n} distinct rank files on {cores} cores: {all_:.2f} s wall, one rank {one:.2f} s; "
                  f"{all_ / ideal:.2f}x ceil(N/C) x one rank (target <= 1.1); CPU time {cpu:.2f}x N x one rank's "
                  f"(what running them side by side adds)", flush=True)
            print(f"ranks  {n} ranks' pool: {workers} workers (bound: {bound}), each peaking at <= {worker_mb:.0f} MB RSS: "
                  f"<= {pool_mb:.0f} MB with the parent, of {free / 1e6 if free else float('nan'):.0f} MB available: "
                  f"{fits}", flush=True)
            lines.append(LINE_FORMATS["ranks"].format(n=n, cores=cores, wall=all_, ratio=all_ / ideal, one=one))
    return lines


def readme_text(lines: list[str]) -> str:
    head = ("Speed (CPU time, `python benchmarks/diagnose_speed.py --readme` printed these lines; the floor is "
            f"`orjson.loads(gzip.open(f).read())` of the same file, measured in the same run, perfscope byte-compiled "
            f"as installed, {os.cpu_count()} cores):")
    return "\n".join([BEGIN, head, *lines, END])


def rewrite_readme(block: str, readme: Path = README) -> None:
    from perfscope.util.files import atomic_write_text

    text = readme.read_text()
    a, b = text.find(BEGIN), text.find(END)
    if a < 0 or b < a:
        raise SystemExit(f"{readme}: no {BEGIN} ... {END} block to rewrite")
    atomic_write_text(readme, text[:a] + block + text[b + len(END):])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace", nargs="?", help="a .json.gz trace (default: the 120-step eager trace built from the "
                    "repository's real H200 one)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--graph-mb", default="50", help="MB of JSON of the CUDA-graph trace; several, comma-separated "
                    "(e.g. 50,200,1000), print the time per event at each size")
    ap.add_argument("--growth", action="store_true", help="CUDA-graph traces of 50, 200 and 1000 MB of JSON (as "
                    "--graph-mb 50,200,1000): diagnose's CPU time per event and its ratio to the floor at each size "
                    "(minutes, and the floor's orjson needs ~10x the JSON in memory: not for CI)")
    ap.add_argument("--ranks", default="8,16", help="rank counts for the multi-rank lines, comma-separated (default "
                    "8,16; 0: none); the rank files are distinct ranks of the first CUDA-graph trace")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--gate", type=float, default=GATE)
    ap.add_argument("--readme", action="store_true")
    ap.add_argument("--only", choices=("eager", "graph", "ranks"))
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.growth:
        a.graph_mb = "50,200,1000"
    if a.child:
        child(a.child[0], a.child[1:])
        return 0
    with tempfile.TemporaryDirectory() as d:
        if a.only in ("graph", "ranks"):
            return run(a, None)
        if a.trace:
            trace = Path(a.trace)
            if not trace.is_file() or not trace.name.endswith(".json.gz"):
                print(f"{trace}: no such .json.gz trace", file=sys.stderr)
                return 2
        else:
            trace = Path(d) / EAGER_NAME
            events = build_in_child(EAGER_SOURCE, trace, EAGER_COPIES)
            print(f"built {trace.name} from {EAGER_SOURCE.name}: {events} events", flush=True)
        return run(a, trace)


def byte_compile() -> None:
    """perfscope's modules compiled to bytecode before anything is measured, as an installed package's
    are: a child then reads them, whatever the environment says (with PYTHONDONTWRITEBYTECODE set,
    every child would compile perfscope's source again, ~0.1 s of CPU per run that no installed
    perfscope spends; without it, the first round alone would)."""
    import compileall

    compileall.compile_dir(str(REPO / "perfscope"), quiet=1)


def run(a, trace: Path) -> int:
    byte_compile()
    print(f"cores: {os.cpu_count()}; each figure the fastest of {a.rounds} rounds; perfscope byte-compiled",
          flush=True)
    lines, gated = [], []
    if trace is not None:
        lines, res = trace_lines("eager", trace, a.rounds, json_mb(trace), peers=not a.check)
        gated = [(res, trace.name)]
    if a.only != "eager":
        sizes = [float(x) for x in a.graph_mb.split(",")]
        growth = []
        with tempfile.TemporaryDirectory() as d:
            first = None
            for mb in sizes:
                graph = Path(d) / f"mla_pool_graph_x{mb:.0f}MB.json.gz"
                events = build_in_child(GRAPH_SOURCE, graph, mb=mb)
                if a.only == "ranks":
                    first = graph
                    break
                more, res = trace_lines("graph", graph, a.rounds, json_mb(graph), peers=first is None and not a.check)
                us = res["cpu"] / events * 1e6
                print(f"graph  {events} events: diagnose {us:.2f} us CPU per event, the floor "
                      f"{res['floor'] / events * 1e6:.2f} us", flush=True)
                growth.append(LINE_FORMATS["growth"].format(mb=res["mb"], events=events, us=us, ratio=res["ratio"]))
                if first is None:
                    lines += more
                    first = graph
                else:
                    graph.unlink()
                if a.only == "graph":
                    gated.append((res, graph.name))
            if len(sizes) > 1:
                lines += growth
            counts = [int(x) for x in a.ranks.split(",") if int(x) > 0]
            if a.only != "graph" and counts and first is not None:
                lines += rank_lines(first, counts, max(1, a.rounds - 1))
    block = readme_text(lines)
    print(block)
    if a.readme:
        rewrite_readme(block)
        print(f"rewrote the speed block of {README}")
    failed = [(res, name) for res, name in gated if res["ratio"] > a.gate] if a.check else []
    for res, name in failed:
        print(f"FAILED: diagnose took {res['ratio']:.2f}x the orjson floor's CPU time on {name} (gate {a.gate})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
