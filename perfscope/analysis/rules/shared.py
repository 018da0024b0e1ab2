"""What more than one rule reads: the GPU idle between decode steps (host-bubble, overlap-off) and the
SGLang scheduler loop a trace's Python frames show. Rules import this module and base.py, never each
other; which rule yields to which is declared in the registry (perfscope.analysis.rules.YIELDS_TO)."""

from __future__ import annotations

import re
from typing import Optional

from perfscope.analysis.rules.base import RuleContext

# SGLang's overlap scheduler once had a kernel of its own (resolve_future_token_ids); SGLang 0.5.23 has
# none (the next input ids are a gather from its FutureMap):
# a trace recorded with Python stacks names the scheduler's loop: `scheduler.py(1482): event_loop_overlap`
# (overlap on) or `event_loop_normal` (off)
_LOOP_FRAME = re.compile(r"managers/scheduler\.py\(\d+\): event_loop_(overlap|normal)\w*$")


def scheduler_loop(trace) -> Optional[str]:
    """ "overlap" / "normal": the SGLang scheduler loop the trace's Python frames show; None if none does."""
    seen = {m.group(1) for f in trace.frames for m in [_LOOP_FRAME.search(f.name)] if m}
    if len(seen) == 1:
        return seen.pop()
    return None


def step_gaps_ms(ctx: RuleContext) -> list[float]:
    """GPU idle between consecutive analysed steps: next step's first kernel - this step's last end."""
    st = [(s.gpu_start, s.gpu_end) for s in ctx.steps if s.gpu_start is not None and s.gpu_end is not None]
    return [max(0.0, (b[0] - a[1]) / 1e3) for a, b in zip(st, st[1:])]
