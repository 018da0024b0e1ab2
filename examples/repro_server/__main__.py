"""Start the reproduction server: ``python -m examples.repro_server [options]`` (from the repo root)
or ``python examples/repro_server [options]``. See README.md beside this file."""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script path: make `examples.repro_server` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    __package__ = "examples.repro_server"
    import examples.repro_server  # noqa: F401

from examples.repro_server.app import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
