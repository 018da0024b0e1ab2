# Shared fixtures live in plugin modules beside this file (tests/ is on sys.path for conftest).
# browser: one Chromium (session) for every module that uses it; bigtrace: the 120-step eager trace;
# profileserver: the profile server stand-in of the trace, signal and capture tests.
import gc
import os
import re

import pytest

pytest_plugins = ["sshd", "real_engines", "browser", "bigtrace", "profileserver"]

# A test that uses one of these fixtures starts a real server, a real sshd or Chromium, or builds the
# 171 MB trace: it is marked `slow` here (`pytest -m "not slow"` leaves it out). Tests that start such
# things themselves carry @pytest.mark.slow (or a module-level pytestmark).
SLOW_FIXTURES = frozenset({
    "sshd", "sshd_factory",                      # tests/sshd.py: a real OpenSSH server on loopback
    "chromium", "open_page",                     # tests/browser.py: headless Chromium
    "sglang_server", "vllm_server",              # tests/real_engines.py: real engines on CPU
    "repro",                                     # tests/reproserver.py: the torch reproduction server
    "big_eager_trace",                           # tests/bigtrace.py: the 120-step eager trace (171 MB)
    "repro_server",                              # test_trace.py: the reproduction server
    "site", "keyed_site",                        # test_fix_restart.py: a restartable reproduction server
    "install_copy",                              # test_fix_untuned_fused_moe.py: a copy of the real SGLang install
})


# pyproject's timeout (120 s) is for the fast tests; a slow test without its own timeout mark gets
# SLOW_TIMEOUT_S, one that uses a real engine's fixture (tests/real_engines.py: the first to ask starts
# the engine, minutes on 2 cores) REAL_ENGINE_TIMEOUT_S.
SLOW_TIMEOUT_S = 600
REAL_ENGINE_TIMEOUT_S = 900
REAL_ENGINE_FIXTURES = frozenset({"sglang_server", "vllm_server"})


def _uses_real_engine(item) -> bool:
    defs = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    # the last definition of a name is the one the test gets (a module may define its own vllm_server)
    return any(defs.get(name) and defs[name][-1].func.__module__ == "real_engines" for name in REAL_ENGINE_FIXTURES)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if SLOW_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
        if item.get_closest_marker("slow") and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(REAL_ENGINE_TIMEOUT_S if _uses_real_engine(item) else SLOW_TIMEOUT_S))


# `pytest -m "not slow"` runs on the machine's cores (pytest-xdist, in the test extra: at most
# FAST_WORKERS processes, one module's tests on one process, so each process reads a trace once,
# tests/realtraces.py): ~70 s instead of ~110 s on 2 cores. Not when the command says otherwise (`-n N`,
# `-n 0` or `-p no:xdist` for one process), with --pdb or -s, nor for any other selection: the slow
# tests' real engines, sshd and Chromium are started once per session, in one process.
FAST_WORKERS = 4


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    if (config.getoption("markexpr", "") or "").strip() != "not slow" or os.environ.get("PYTEST_XDIST_WORKER"):
        return None
    if not config.pluginmanager.hasplugin("xdist") or config.getoption("numprocesses", None) is not None:
        return None
    if config.getoption("usepdb", False) or config.getoption("capture", "fd") == "no" or config.getoption("collectonly"):
        return None
    config.option.numprocesses = "auto"
    config.option.maxprocesses = config.option.maxprocesses or FAST_WORKERS
    if config.option.dist == "no":
        config.option.dist = "loadfile"
    return None


# A module whose top-level `pytestmark` carries `pytest.mark.slow` (one line, as every such module writes
# it) has only slow tests: under `-m "not slow"` it is not even imported, which spares the fast run the
# imports only those modules make (torch, hypothesis, Ray: ~6 s of CPU) and their assertion rewriting.
_SLOW_MODULE = re.compile(r"^pytestmark\s*=.*\bpytest\.mark\.slow\b", re.M)


def pytest_ignore_collect(collection_path, config):
    if (config.getoption("markexpr", "") or "").strip() != "not slow":
        return None
    if collection_path.suffix == ".py" and collection_path.name.startswith("test_"):
        if _SLOW_MODULE.search(collection_path.read_text(encoding="utf-8")):
            return True
    return None


# What a test module leaves alive for the session (tests/realtraces.py's traces and analyses, lru-cached
# outputs, imported modules: millions of objects) is frozen out of the cyclic collector when the module
# is done: its full passes would otherwise walk all of it again and again (~12 s of CPU over the fast
# run). The module's own cyclic garbage is collected first, so nothing is frozen that is already garbage.
# A pass every 10,000 allocations instead of 700: the fewer full passes over what a module builds (its
# traces, their analyses) cost ~4 s less over the fast run; a cycle lives a few thousand allocations longer.
gc.set_threshold(10_000, 10, 10)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    yield
    if nextitem is None or nextitem.path != item.path:
        gc.collect()
        gc.freeze()


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    gc.unfreeze()  # after pytest's own collection: one pass over what the session kept, not two


@pytest.fixture(scope="module", autouse=True)
def _shared_reads(request):
    """A module marked ``pytest.mark.shared_reads`` reads committed real traces once per session
    (tests/realtraces.py's shared_reads: the analysis of a file it has read before reuses the read), its
    module-scoped fixtures included (set up after this one: autouse comes first within a scope)."""
    if request.node.get_closest_marker("shared_reads") is None:
        yield
        return
    from realtraces import shared_reads

    with shared_reads():
        yield
