"""Before/after under a background load, on the real SGLang 0.5.23 on CPU (tests/real_engines.py):
the same unchanged server measured as fix measures it while another process keeps a core busy.
Each side takes as many requests as its decision needs, within the bound. A 2-core box under
that load drifts between phases (seen: 2.40 ms then 3.40 ms median, the server unchanged), so
fix's keep-or-revert decision (perfscope.fixengine.verdict.decide) may say "revert"; fix then
measures the original again (verdict.blame, A-B-A), and an unchanged server must never have the
slowdown put on the patch."""

from __future__ import annotations

import subprocess
import sys

import pytest

from perfscope.bench.core import measure_until
from perfscope.bench.vocab import token_ids
from perfscope.fixengine.verdict import before_known, blame, decide, samples
from perfscope.remote.hostio import LocalHost
from perfscope.remote.sglang_api import SGLangClient

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]  # a real SGLang on CPU

MAX = 16


def test_an_unchanged_server_under_background_load_is_never_blamed_on_the_patch(sglang_server):
    client = SGLangClient(sglang_server.url)
    info = client.server_info()
    ids, _ = token_ids(info, LocalHost())
    kw = dict(input_len=16, output_len=16, num_requests=4, max_requests=MAX, warmup=1, server_info=info, ids=ids)
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])  # a core kept busy throughout
    try:
        before = measure_until(client, before_known, **kw)
        b = samples(before)
        after = measure_until(client, lambda a: decide(b, a, 0.10)[0] is not None, **kw)
        a = samples(after)
        again = None
        if decide(b, a, 0.10)[0] == "revert":
            again = samples(measure_until(client, lambda x: blame(a, x, 0.10)[0] is not None, **kw))
    finally:
        burner.kill()
        burner.wait()
    assert 4 <= len(b) <= MAX and 4 <= len(a) <= MAX, (len(b), len(a))
    decision, c = decide(b, a, 0.10)
    if decision == "revert":  # the host drifted between the phases: A-B-A must not blame the patch
        assert again is not None and 4 <= len(again) <= MAX
        who, c2 = blame(a, again, 0.10)
        assert who != "patch", (c, c2)
    assert c["interval"] is not None and c["before"]["min"] <= c["before"]["median"] <= c["before"]["max"]
    if decision is None:  # undecided at the bound: only when the interval straddles the threshold
        assert len(a) == MAX and c["interval"][0] <= 0.10 < c["interval"][1], c
    assert sglang_server.healthy()
