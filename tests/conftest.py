# Shared fixtures live in plugin modules beside this file (tests/ is on sys.path for conftest).
# browser: one Chromium (session) for every module that uses it; bigtrace: the 120-step eager trace;
# profileserver: the profile server stand-in of the trace, signal and capture tests.
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


# pyproject's timeout (120 s) is for the fast tests; a slow test without its own timeout mark gets this.
SLOW_TIMEOUT_S = 600


def pytest_collection_modifyitems(config, items):
    for item in items:
        if SLOW_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
        if item.get_closest_marker("slow") and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(SLOW_TIMEOUT_S))
