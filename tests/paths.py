"""Where the shared real traces live: ../shared/traces beside the repository (read in place)."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TRACES = REPO.parent / "shared" / "traces"
H200 = TRACES / "h200-mla-fp8-kv"
PUBLIC = TRACES / "public"
TRACELENS = PUBLIC / "TraceLens" / "tests" / "traces"
HTA = PUBLIC / "HolisticTraceAnalysis" / "tests" / "data"
