"""Before/after under a background load, on the real SGLang 0.5.23 on CPU (tests/real_engines.py):
the same unchanged server measured twice while another process keeps a core busy. fix's
keep-or-revert decision (perfscope.fixengine.restart.decide) must not revert on that noise, and
each side takes as many requests as its decision needs, within the bound."""

from __future__ import annotations

import subprocess
import sys

from perfscope.bench.core import measure_until
from perfscope.capture.hostio import LocalHost
from perfscope.capture.sglang_api import SGLangClient
from perfscope.capture.vocab import token_ids
from perfscope.fixengine.restart import _before_known, _samples, decide

MAX = 16


def test_an_unchanged_server_under_background_load_is_not_reverted(sglang_server):
    client = SGLangClient(sglang_server.url)
    info = client.server_info()
    ids, _ = token_ids(info, LocalHost())
    kw = dict(input_len=16, output_len=16, num_requests=4, max_requests=MAX, warmup=1, server_info=info, ids=ids)
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])  # a core kept busy throughout
    try:
        before = measure_until(client, _before_known, **kw)
        b = _samples(before)
        after = measure_until(client, lambda a: decide(b, a, 0.10)[0] is not None, **kw)
    finally:
        burner.kill()
        burner.wait()
    a = _samples(after)
    assert 4 <= len(b) <= MAX and 4 <= len(a) <= MAX, (len(b), len(a))
    decision, c = decide(b, a, 0.10)
    assert decision != "revert", c  # the server did not change: no revert on noise
    assert c["interval"] is not None and c["before"]["min"] <= c["before"]["median"] <= c["before"]["max"]
    if decision is None:  # undecided at the bound: only when the interval straddles the threshold
        assert len(a) == MAX and c["interval"][0] <= 0.10 < c["interval"][1], c
    assert sglang_server.healthy()
