"""The step after a fix, replayed on the CPU launch timeline (perfscope.analysis.stepmodel), on real traces.

The H200 pair in tests/traces/corpus/h200-mla-fp8-kv: the bug (whole-pool cast) and the fix (native
FP8, no cast), both profiled the same way, and measured.json's CUDA-event medians of the same
runs. "Step minus cast time" said 7.02 ms for the eager step; the fix measured 9.84 ms unprofiled
and 29.0 ms per step under the profiler: the casts hid launch gaps that come back.
"""

from __future__ import annotations

import json
import re
import statistics
from dataclasses import replace
from pathlib import Path

import pytest

from paths import H200, HTA, KERNEL_MIX, TRACELENS
from perfscope.analysis.cpu_ops import cpu_ops_as_kernels
from perfscope.analysis.steps import find_steps
from perfscope.analysis.stepmodel import StepReplay
from realtraces import real_diagnosis, real_trace

pytestmark = pytest.mark.shared_reads  # analyses of committed real traces share their reads (tests/realtraces.py)

MEASURED = json.loads((H200 / "measured.json").read_text())


def cast_finding(name):
    d = real_diagnosis(H200 / name).to_dict()
    return d, next(f for f in d["findings"] if f["id"] == "fp8-kv-cast")


def test_eager_prediction_is_held_up_by_the_launch_timeline():
    _, f = cast_finding("mla_pool_eager.json.xz")
    p = f["evidence"]["prediction"]
    after_trace = real_diagnosis(H200 / "mla_fp8_eager.json.xz").to_dict()["steps"]["median_ms"]
    # the old kernel-only answer (step minus the casts) is far below what the fix measured
    assert p["kernel_only_prediction_ms"] == pytest.approx(7.02, abs=0.05)
    assert p["kernel_only_prediction_ms"] < 0.75 * MEASURED["eager"]["fp8"]["median_ms"]
    # the fixed run's own trace is profiled: its launch-bound steps take 3x the unprofiled ones, and
    # the prediction is of the unprofiled step (the host's time scaled by the profiler's measured
    # slow-down, perfscope.analysis.hosttime): within 15% of the CUDA-event measurement of the fix
    assert after_trace > 2.5 * MEASURED["eager"]["fp8"]["median_ms"]
    assert f["predicted_step_ms_after_fix"] == pytest.approx(MEASURED["eager"]["fp8"]["median_ms"], rel=0.15)
    assert f["evidence"]["prediction"]["launch_bound_steps"] == "5/5"
    lo, hi = p["range_ms"]
    assert p["lower_bound_ms"] <= MEASURED["eager"]["fp8"]["median_ms"] and lo <= MEASURED["eager"]["fp8"]["median_ms"] <= hi
    assert "~%.1f ms" % f["predicted_step_ms_after_fix"] in f["summary"]


def test_graph_prediction_matches_the_measured_fix():
    _, f = cast_finding("mla_pool_graph.json.xz")
    p = f["evidence"]["prediction"]
    # one graph launch per step: nothing hides a launch, the kernel-only answer stands
    assert p["launch_bound_steps"] == "0/5"
    assert f["predicted_step_ms_after_fix"] == pytest.approx(MEASURED["graph"]["fp8"]["median_ms"], rel=0.1)


DSK_TRAIN = Path(__file__).parent / "traces/deepseek-profile-data/train.json.gz"  # H800, DeepEP + NCCL streams
V100_NCCL = HTA / "df_index_resolver/df_index_resolver.json.xz"  # NCCL on its own stream


@pytest.mark.parametrize("path", [H200 / "mla_pool_eager.json.xz", H200 / "mla_fp8_graph.json.xz",
                                  KERNEL_MIX / "sample_topp.json.gz", KERNEL_MIX / "fi_decode_eager.json.gz",
                                  TRACELENS / "inference/sglang_decode/sglang_Qwen3-8B_decode.json.xz",
                                  DSK_TRAIN, V100_NCCL])
def test_replay_with_recorded_durations_reproduces_the_step(path):
    # one compute stream (+ graph replays), and ranks with their collectives on other streams, whose
    # cross-stream waits the replay reads off the GPU timeline
    t = real_trace(path)
    steps = [s for s in find_steps(t).steps if s.kernels]
    errs = []
    for s in steps[:8]:
        r = StepReplay(t, s)
        span = r.run(lambda i: t.kernels[i].dur)["span_us"]
        errs.append(abs(span - s.gpu_us) / s.gpu_us)
    errs.sort()
    assert errs[len(errs) // 2] < 0.1 and errs[-1] < 0.2, errs


# ---- torch-sampling: the pair measured on the H200 (tests/traces/h200-kernel-mix/timings.json) ------

TIMINGS = json.loads((KERNEL_MIX / "timings.json").read_text())


@pytest.mark.parametrize("variant,key", [("topp", "torch_topp_saving_ms"), ("topk", "torch_topk_saving_ms")])
def test_torch_sampling_prediction_matches_the_measured_saving(variant, key):
    d = real_diagnosis(KERNEL_MIX / f"sample_{variant}.json.gz").to_dict()
    f = next(f for f in d["findings"] if f["id"] == "torch-sampling")
    measured_saving = TIMINGS[key]  # CUDA events: the same graph forward + torch sampling vs + argmax
    predicted_saving = d["steps"]["median_ms"] - f["predicted_step_ms_after_fix"]
    assert predicted_saving == pytest.approx(measured_saving, rel=0.2), (predicted_saving, measured_saving)
    ev = f["evidence"]
    assert ev["mode"] == ("top-p" if variant == "topp" else "top-k")
    # the path is more than its sort: softmax over the vocabulary, cumsum (top-p), multinomial
    kinds = ev["sampling_path_ms_by_kind"]
    assert kinds["sort/topk"] < ev["sampling_path_ms_per_step"]
    assert kinds.get("softmax", 0) > 0 and kinds.get("multinomial/argmax", 0) > 0
    if variant == "topp":
        assert kinds["cumsum"] > 0.1  # 0.2 ms of scan over [8, 151936]
    assert ev["batch_vocab"] == [8, 151936]
    # the sampling bucket holds the whole path, not only the sort kernels
    assert d["buckets"]["sampling"]["ms_per_step"] == pytest.approx(ev["sampling_path_ms_per_step"], rel=0.01)


@pytest.mark.parametrize("name", ["sample_argmax", "fi_decode_graph", "fi_decode_eager", "triton_norm_rope_eager"])
def test_torch_sampling_stays_quiet_on_greedy_and_fused_sampling(name):
    d = real_diagnosis(KERNEL_MIX / f"{name}.json.gz").to_dict()
    assert "torch-sampling" not in {f["id"] for f in d["findings"]}
    # FlashInfer's norm/activation/rope/sampling kernels are not attention: the MLA kernel alone is
    mla = sum(o["ms_per_step"] for o in d["ops"] if "BatchMLAPagedAttentionKernel" in o["name"])
    assert d["buckets"]["attention"]["ms_per_step"] == pytest.approx(mla, rel=0.01)
    if name.startswith("fi_"):
        assert d["buckets"]["sampling"]["ms_per_step"] > 0.2  # FlashInfer's sampling kernels + softmax


@pytest.mark.parametrize("mode,rel", [("eager", 0.15), ("graph", 0.1)])
def test_compare_shows_the_prediction_error_against_the_measured_after(mode, rel):
    from perfscope.analysis.compare import compare

    before = real_diagnosis(H200 / f"mla_pool_{mode}.json.xz")
    after = real_diagnosis(H200 / f"mla_fp8_{mode}.json.xz")
    c = compare(before, after)
    p = next(x for x in c["predictions"] if x["finding"] == "fp8-kv-cast")  # listed: it is gone in AFTER
    assert p["measured_step_ms"] == pytest.approx(after.primary.steps.median_ms, abs=0.01)
    # AFTER has no bench: the prediction (of the unprofiled step) is held to the profiled step, said so,
    # and its GPU work to AFTER's kernel time per step
    assert p["measured_under_profiler"] and abs(p["gpu_work_error_pct"]) < 10, p
    unprofiled = MEASURED[mode]["fp8"]["median_ms"]  # CUDA events, same runs, no profiler
    assert p["predicted_step_ms"] == pytest.approx(unprofiled, rel=rel), p
    if mode == "eager":  # the profiled launch-bound step is 3x the unprofiled one: a large "error"
        assert p["error_pct"] < -60 and p["kernel_only_error_pct"] < -70
    else:
        assert abs(p["error_pct"]) < rel * 100, p


@pytest.mark.parametrize("run", ["h200-2026-11-29", "h200-2026-11-29-overlap", "h200-2026-11-29-pool250k"])
def test_graph_decode_with_a_blocking_host_copy(run):
    # The repro server (examples/repro_server) on the H200: each graph step ends in a copy to the host
    # that blocks ~58 ms until the casts are done; fixed, that wait ends as early as the GPU does
    from paths import GPU_LOOP

    runs = GPU_LOOP / run / "runs"
    before = real_diagnosis(next(iter((runs / "bug/traces").glob("*DECODE*.json.xz")))).to_dict()
    after = real_diagnosis(next(iter((runs / "native/traces").glob("*DECODE*.json.xz")))).to_dict()
    f = next(x for x in before["findings"] if x["id"] == "fp8-kv-cast")
    assert f["predicted_step_ms_after_fix"] == pytest.approx(after["steps"]["median_ms"], rel=0.15)


REPRO_CPU = Path(__file__).parent / "fixtures" / "repro-cpu-demo-before-DECODE.trace.json.gz"


def test_cpu_only_cast_prediction_pairs_each_step_with_its_own_casts():
    """tests/fixtures/repro-cpu-demo-before-DECODE.trace.json.gz: the "before" DECODE trace that
    `perfscope demo` (the repro server on CPU, 4 layers, 32,768-token FP8 pool, 4 steps) brought back,
    unmodified. Its 4 steps took 402, 596, 440 and 418 ms (one slowed by a busy host): the casts' mean
    (440 ms per step) exceeded the median step (429 ms) and "step minus casts" clamped to 0 ms. Each
    step's casts are <= that step (one thread, self time), so pairing them gives a real prediction."""
    d = real_diagnosis(REPRO_CPU).to_dict()
    (r,) = d["ranks"]
    f = next(f for f in r["findings"] if f["id"] == "fp8-kv-cast")
    step = r["steps"]["median_ms"]
    # independently: each step's span and its aten::copy_ self time, from the raw trace
    t = real_trace(REPRO_CPU)
    t = replace(t, kernels=cpu_ops_as_kernels(t))
    steps = [s for s in find_steps(t).steps if s.phase == "decode"]
    assert len(steps) == 4
    pairs = [(s.gpu_us / 1e3, sum(t.kernels[i].dur for i in s.kernels if t.kernels[i].name == "aten::copy_") / 1e3)
             for s in steps]
    assert all(0 < c <= g for g, c in pairs)
    assert statistics.mean(c for _, c in pairs) > step  # the trap: a mean cast above the median step
    want = statistics.median(g - c for g, c in pairs)
    assert f["predicted_step_ms_after_fix"] == pytest.approx(want, rel=0.02)
    assert 0 < f["predicted_step_ms_after_fix"] < 0.2 * step
    assert f["evidence"]["prediction"]["model"].startswith("CPU-only trace")
    # the summary's cast time is the median step's share, never more than the step
    m = re.search(r": ([\d.]+) ms of a ([\d.]+) ms step", f["summary"])
    assert m and float(m.group(1)) <= float(m.group(2)) == round(step, 1)
    assert f"~{f['predicted_step_ms_after_fix']:.1f} ms" in f["summary"]


# ---- the host floor: real SGLang on the H200 (examples/gpu_loop/results/h200-2026-12-01-sglang) ------

SGL = Path(__file__).resolve().parents[1] / "examples/gpu_loop/results/h200-2026-12-01-sglang"


def test_graph_decode_fixed_is_bound_by_the_host():
    """SGLang 0.5.13, CUDA graphs + overlap scheduler, 495k-token FP8 pool, batch 1 (the fix loop of
    h200-2026-12-01-sglang/pool495000-restart): the bug's GPU is 7.8 ms behind a CPU that runs ahead,
    so replaying its launches sees no host cost (1.02 ms of GPU work); the fixed server's TPOT, measured
    by `fix --apply --restart-cmd` on the freshly restarted server, was 1.15 ms, its trace's step 3 ms
    (profiled). The host's own work per step, recomputed here from the raw runtime calls, scaled by
    the profiler's measured slow-down of the host (perfscope.analysis.hosttime), bounds the step."""
    from perfscope.analysis.hosttime import SCALE

    bug = SGL / "pool495000-restart/runs/495000-bug"
    before, after = real_diagnosis(bug), real_diagnosis(SGL / "pool495000-restart/runs/495000-pages")
    f = next(x.to_dict() for x in before.primary.findings if x.id == "fp8-kv-cast")
    p = f["evidence"]["prediction"]
    assert p["bound"] == "host" and p["host"]["source"] == "full"
    assert p["gpu_work_ms"] == pytest.approx(after.primary.kernel_ms_per_step, rel=0.15)  # GPU work: right
    fresh = json.loads((SGL / "pool495000-restart/runs/495000-fixrun/restart.json").read_text())["tpot_ms_after"]
    lo, hi = p["range_ms"]
    assert lo <= fresh <= hi and p["gpu_work_ms"] < fresh
    assert after.primary.steps.median_ms > hi  # the profiled fixed step: above any unprofiled one
    assert "the host bounds the step" in f["summary"] and f"~{f['predicted_step_ms_after_fix']:.1f} ms" in f["summary"]
    # independently: per step, the scheduler thread's time from one step[DECODE] annotation to the
    # next, less its cudaEventSynchronize time (it waits there on the previous step's GPU work); the
    # quickest tenth of the steps, scaled
    t = real_trace(next((bug / "traces").glob("*DECODE*")))
    ann = sorted(a.ts for a in t.annotations if a.name.startswith("step[DECODE") and not a.gpu)
    busy = []
    for a, b in zip(ann, ann[1:]):
        waits = sum(l.dur for l in t.launches if a <= l.ts < b and l.name == "cudaEventSynchronize")
        busy.append((b - a - waits) / 1e3)
    busy.sort()
    assert busy[len(busy) // 10] * SCALE["full"].point == pytest.approx(p["host"]["point"], rel=0.05)


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_host_time_bounds_only_the_launch_bound_prediction(mode):
    # the shared H200 pair: graph steps are GPU-bound after the fix, eager steps bound by their launches
    _, f = cast_finding(f"mla_pool_{mode}.json.xz")
    p = f["evidence"]["prediction"]
    if mode == "graph":  # the graph replays the kernels back to back: the GPU bounds the fixed step
        assert p["bound"] == "gpu" and p["host"]["point"] < p["predicted_step_ms"] == p["gpu_work_ms"]
    else:  # eager: each kernel waits for its launch, the host's work bounds the step (launch-bound)
        assert p["bound"] == "host" and p["gpu_work_ms"] < p["host"]["point"] == p["predicted_step_ms"]


# ---- prefill (EXTEND) steps: what the prediction assumes, and the range over the fix's strategies -----

def _extend_pair(run, strategy):
    from paths import GPU_LOOP

    runs = GPU_LOOP / run / "runs"
    return (next(iter((runs / "bug/traces").glob("*EXTEND*.json.xz"))),
            next(iter((runs / f"{strategy}/traces").glob("*EXTEND*.json.xz"))))


def _mla_ms(path):
    d = real_diagnosis(path).to_dict()
    return sum(o["ms_per_step"] for o in d["ops"] if "BatchMLAPagedAttentionKernel" in o["name"])


def test_native_mla_slowdown_is_what_the_h200_runs_measured():
    """NATIVE_MLA_SLOWDOWN (fp8_kv_cast.py) is the ratio of FlashInfer's MLA kernel time reading FP8
    (native) to reading the BF16 copy (bug), recomputed here from the calibration run's traces and
    checked on the runs it was not taken from: the -pool250k and -overlap repro-server runs and, for
    decode, the stepbench pair in tests/traces/corpus (made by a different script)."""
    from perfscope.analysis.rules.fp8_kv_cast import NATIVE_MLA_SLOWDOWN

    for run in ("h200-2026-11-29", "h200-2026-11-29-pool250k", "h200-2026-11-29-overlap"):
        b, a = _extend_pair(run, "native")
        assert _mla_ms(a) / _mla_ms(b) == pytest.approx(NATIVE_MLA_SLOWDOWN["prefill"], rel=0.02), run
        from paths import GPU_LOOP

        runs = GPU_LOOP / run / "runs"
        b, a = (next(iter((runs / f"{v}/traces").glob("*DECODE*.json.xz"))) for v in ("bug", "native"))
        assert _mla_ms(a) / _mla_ms(b) == pytest.approx(NATIVE_MLA_SLOWDOWN["decode"], rel=0.02), run
    stepbench = _mla_ms(H200 / "mla_fp8_graph.json.xz") / _mla_ms(H200 / "mla_pool_graph.json.xz")
    assert stepbench == pytest.approx(NATIVE_MLA_SLOWDOWN["decode"], rel=0.06)


@pytest.mark.parametrize("run", ["h200-2026-11-29-pool250k", "h200-2026-11-29-overlap"])
def test_prefill_prediction_states_its_assumption_and_spans_both_strategies(run):
    """The prefill step (EXTEND, 4000 tokens) of the repro server on the H200, fixed both ways. The
    casts are 26% of it; removing them predicts ~152 ms, which the pages strategy measured (-0.2%,
    -4.1%), while native measured ~210 ms (-28%): FlashInfer's MLA kernel reading FP8 took 1.9x its
    BF16 time, +57 ms. The prediction says it assumes the other kernels stay, gives the native
    outcome and the range; compare finds the broken assumption in AFTER and accounts for the error."""
    from perfscope.analysis.compare import compare

    b, native = _extend_pair(run, "native")
    _, pages = _extend_pair(run, "pages")
    before = real_diagnosis(b)
    assert before.primary.steps.phase == "prefill"
    f = next(x.to_dict() for x in before.primary.findings if x.id == "fp8-kv-cast")
    p = f["evidence"]["prediction"]
    assert "every other kernel keeps its time" in p["assumes"] and "(every other kernel as it is)" in f["summary"]
    assert "native" in f["summary"] and "1.89x" in f["summary"]
    lo, hi = p["range_ms"]
    assert lo < f["predicted_step_ms_after_fix"] < p["alternatives"]["native"]["predicted_step_ms"] < hi
    rows = {}
    for name, after in (("pages", pages), ("native", native)):
        a = real_diagnosis(after)
        row = next(x for x in compare(before, a)["predictions"] if x["finding"] == "fp8-kv-cast")
        measured = a.primary.steps.median_ms
        assert row["within_range"] and lo * 0.95 <= measured <= hi * 1.05
        rows[name] = (row, measured)
    assert abs(rows["pages"][0]["error_pct"]) < 5  # the assumption held
    row, measured = rows["native"]
    assert row["error_pct"] < -25  # the assumption broke ...
    assert p["alternatives"]["native"]["predicted_step_ms"] == pytest.approx(measured, rel=0.03)  # ... by how much
    top = row["unchanged_kernels_largest"][0]
    assert "BatchMLAPagedAttentionKernel" in top["short"] and top["delta_ms"] > 50
    assert abs(row["error_with_measured_kernels_pct"]) < 2  # the whole error is the attention kernel's


def test_native_decode_outcome_holds_the_shared_stepbench_pair():
    # decode, graph, tests/traces/corpus: native measured 6.98 ms (CUDA events); casts-only said 6.42, the
    # native outcome (attention 1.43x) says ~7.16, and the range holds the measurement
    _, f = cast_finding("mla_pool_graph.json.xz")
    p = f["evidence"]["prediction"]
    measured = MEASURED["graph"]["fp8"]["median_ms"]
    native = p["alternatives"]["native"]["predicted_step_ms"]
    assert p["range_ms"][0] < measured < p["range_ms"][1]
    assert abs(native - measured) < 0.5 * abs(f["predicted_step_ms_after_fix"] - measured)


# ---- cross-stream waits (cudaStreamWaitEvent) ------------------------------------------------------------

@pytest.mark.parametrize("path", [DSK_TRAIN, V100_NCCL])
def test_cross_stream_waits_found_on_the_timeline_are_real_event_waits(path):
    """The waits the replay infers from the GPU timeline (a kernel that started later than its launch
    and its stream allow, just after another stream's kernel ended), checked against what the trace
    recorded on the CPU side: each one was launched after a cudaStreamWaitEvent call of its process,
    made after that stream's previous launch. DeepSeek's H800 training step (DeepEP and NCCL streams)
    and HTA's V100 rank (NCCL on its own stream)."""
    import bisect

    t = real_trace(path)
    by_corr = {l.corr: l for l in t.launches if l.corr is not None}
    waits = {}
    for l in t.launches:
        if l.name == "cudaStreamWaitEvent":
            waits.setdefault(l.pid, []).append(l.ts)
    for w in waits.values():
        w.sort()
    kern = t.kernels
    found = confirmed = 0
    for s in [s for s in find_steps(t).steps if s.kernels][:3]:
        r = StepReplay(t, s)
        prev_launch, prev_of = {}, {}
        for i in sorted(s.kernels, key=lambda j: kern[j].ts):
            l = by_corr.get(kern[i].corr)
            prev_of[i] = prev_launch.get(kern[i].stream)
            if l is not None:
                prev_launch[kern[i].stream] = l.ts
        for i, (j, gap) in r.dep.items():
            if gap < 0:
                continue  # held back by the SMs another stream's kernel held: no event involved
            assert kern[j].stream != kern[i].stream and 0 <= gap < 50
            found += 1
            l = by_corr[kern[i].corr]
            w = waits.get(l.pid, [])  # (one DeepSeek wait is issued by another thread of the process)
            lo = prev_of[i] if prev_of[i] is not None else l.ts - 1e6
            confirmed += bisect.bisect_right(w, l.ts) > bisect.bisect_left(w, lo)
    assert found >= 10 and confirmed == found, (found, confirmed)


XS = Path(__file__).parent / "traces/h200-cross-stream"  # examples/cross_stream/make_traces.py, on the H200
XS_TIMINGS = json.loads((XS / "timings.json").read_text())


def _xs(name):
    t = real_trace(XS / f"{name}.json.gz")
    return t, [s for s in find_steps(t).steps if s.kernels]


def _med(xs):
    return statistics.median(xs)


@pytest.mark.parametrize("fmt", ["", "_sync"])
@pytest.mark.parametrize("after", ["side_short", "pre_short"])
def test_cross_stream_step_replayed_against_the_measured_after(after, fmt):
    """A two-stream step measured on the H200 both ways: the main stream's pre work, an event, a
    3 ms "collective" on a side stream that waits on it (a one-SM spin kernel, as an NCCL kernel
    holds a few SMs), the main stream's independent work, then a wait on the collective's event.
    From ``base`` alone, with the kernels the change touches given AFTER's durations (the collective
    cut to 0.3 ms; the pre matmuls shrunk from 4096 to 1024), the replay must follow the waits across
    the streams: the collective starting earlier, or the main stream no longer waiting for it. Before
    it did (each stream waiting only on itself, a side stream's first kernel kept where it ran) it
    said 4.16 ms for side_short (+69%) and 4.12 for pre_short (+16%); kernel-only (minus the kernel
    time saved) says 1.32 for side_short (-47%). Both trace formats: torch.profiler's default and
    with Kineto's cuda_sync events."""
    from perfscope.analysis.stepmodel import predict_after

    bt, bs = _xs("base" + fmt)
    at, as_ = _xs(after + fmt)
    kb, ka = bt.kernels, at.kernels
    spin = lambda k: "spin_kernel" in k.name
    if after == "side_short":
        new = _med([ka[i].dur for s in as_ for i in s.kernels if spin(ka[i])])
        nd = {i: new for s in bs for i in s.kernels if spin(kb[i])}
    else:
        def pre(t, s):  # the step's first 4 GEMMs on the main stream
            return [i for i in sorted(s.kernels, key=lambda j: t.kernels[j].ts)
                    if t.kernels[i].kind == "kernel" and not spin(t.kernels[i])][:4]
        new = [_med([ka[pre(at, s)[p]].dur for s in as_]) for p in range(4)]
        nd = {i: new[p] for s in bs for p, i in enumerate(pre(bt, s))}
    step = _med([s.gpu_us for s in bs]) / 1e3
    p = predict_after(bt, bs, step, lambda i: nd.get(i))
    measured = _med([s.gpu_us for s in as_]) / 1e3
    events = XS_TIMINGS["variants"][after]["cuda_events"]["median_ms"]  # unprofiled, CUDA events
    assert p["predicted_step_ms"] == pytest.approx(measured, rel=0.08), (p, measured)
    assert p["predicted_step_ms"] == pytest.approx(events, rel=0.08), (p, events)
    assert step > 1.1 * measured  # the change is real: the step got shorter, and the replay saves that
    assert p["step_time_saved_ms"] == pytest.approx(step - measured, rel=0.2)
    if after == "side_short":  # the collective was only half on the critical path: kernel-only is far low
        assert p["kernel_only_prediction_ms"] < 0.7 * measured
    # the waits it followed: the spin kernel waits on a main-stream GEMM (pre), the main stream on the spin
    r = StepReplay(bt, bs[1])
    waits = {(kb[i].stream, kb[j].stream, spin(kb[i]), spin(kb[j])) for i, (j, _) in r.dep.items()}
    main, side = kb[next(i for i in bs[1].kernels if not spin(kb[i]))].stream, \
        kb[next(i for i in bs[1].kernels if spin(kb[i]))].stream
    assert (side, main, True, False) in waits and (main, side, False, True) in waits


@pytest.mark.parametrize("bug, fixrun", [
    ("pool495000-restart/runs/495000-bug", "pool495000-restart/runs/495000-fixrun"),
    ("pool-default/runs/default-bug", "pool-default/runs/default-fixrun")])
def test_host_bound_range_holds_every_real_sglang_fix(bug, fixrun):
    """Two real SGLang fix loops on the H200 (495k-token pool; SGLang's default 15.8M-token pool), each
    `fix --apply --restart-cmd` measuring the freshly restarted server. Fixed, each is bound by the
    host: the GPU work (~1 ms) is below the TPOT. Their bug traces are full profiles only (no GPU-only
    host-timing profile): the host's time is the trace's scaled by the full profile's measured range,
    wide (0.25-0.45) because a process's host speed varies between starts; the measured TPOT lies in it
    (the point, 0.38, is 49% and 26% high here: a GPU-only profile is what narrows it), and the
    kernel-only answer this replaced was below it."""
    b = real_diagnosis(SGL / bug)
    f = next(x.to_dict() for x in b.primary.findings if x.id == "fp8-kv-cast")
    p = f["evidence"]["prediction"]
    r = json.loads((SGL / fixrun / "restart.json").read_text())
    assert r["outcome"] == "applied" and not r["reverted"]
    measured = r["tpot_ms_after"]
    lo, hi = p["range_ms"]
    assert p["bound"] == "host" and p["gpu_work_ms"] < measured and lo <= measured <= hi
    assert p["kernel_only_prediction_ms"] < 0.95 * measured
