# Shared fixtures live in plugin modules beside this file (tests/ is on sys.path for conftest).
# browser: one Chromium (session) for every module that uses it; bigtrace: the 120-step eager trace.
pytest_plugins = ["sshd", "real_engines", "browser", "bigtrace"]
