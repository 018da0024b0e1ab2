"""The 120-step eager trace (171 MB of JSON) the size and speed tests read: built once per session
from the repository's real 5-step H200 eager trace by the speed benchmark's own builder (its events
repeated, each copy with its own ids and times), so that no 13 MB file has to live in the repository."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from paths import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import diagnose_speed  # noqa: E402


@pytest.fixture(scope="session")
def big_eager_trace(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("big") / "mla_pool_eager_x120steps.json.gz"
    diagnose_speed.build_repeated_trace(diagnose_speed.EAGER_SOURCE, diagnose_speed.EAGER_MB, out,
                                        diagnose_speed.EAGER_COPIES)
    return out
