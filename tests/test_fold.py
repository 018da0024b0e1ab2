"""perfscope.util.fold.added: the float sum a Python loop makes (left to right, no compensation), in C."""

from __future__ import annotations

from paths import H200
from perfscope.util.fold import added
from realtraces import real_trace


def _loop(values, start=0.0):
    total = start
    for v in values:
        total += v
    return total


def test_added_is_the_loop_on_real_durations():
    kern = real_trace(H200 / "mla_pool_eager.json.xz").kernels
    durs = [k.dur for k in kern]
    assert len(durs) > 1000
    assert added(durs) == _loop(durs)
    assert added(durs[::-1], 12.5) == _loop(durs[::-1], 12.5)
    assert added([]) == 0.0 and added([], 3.0) == 3.0


def test_added_rounds_each_addition_as_the_loop_does():
    # a compensated sum (the builtin sum on Python 3.12+) keeps the 1.0; one addition after another loses it
    assert added([1e16, 1.0, -1e16]) == _loop([1e16, 1.0, -1e16]) == 0.0
    assert added([-0.0]) == _loop([-0.0]) == 0.0  # from 0.0, as the loop starts
