# Shared fixtures live in plugin modules beside this file (tests/ is on sys.path for conftest).
pytest_plugins = ["sshd", "real_engines"]
