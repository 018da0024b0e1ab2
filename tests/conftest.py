# Shared fixtures live in plugin modules beside this file (tests/ is on sys.path for conftest).
pytest_plugins = ["sshd", "browser"]  # browser: one Chromium (session) for every module that uses it
