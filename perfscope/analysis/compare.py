"""Compare two diagnoses (before / after a fix): a pure data diff, JSON-ready, no rendering.

``compare(before, after)`` returns a dict that the terminal and HTML renderers (and ``--json``) read:

    step      decode step time (GPU work, median) before/after, delta, ratio (after/before), speedup
    tpot      client-measured TPOT from run folders, when both sides have it
    buckets   per bucket: ms/step and share before/after and their deltas (largest change first)
    findings  ids that disappeared ("gone"), appeared ("new") and stayed ("kept", with ms before/after)
    ops       top ops matched by (short name, bucket): ms/step and count/step before/after, gone/new/changed
    predictions  for each finding of BEFORE that predicted its fixed step and is gone in AFTER: the
              predicted step vs AFTER's measured step, and the error in % ((predicted - measured) /
              measured); the same scaled to TPOT when both sides have a client TPOT (a host-bound
              prediction gives the TPOT range, GPU work to profiled host, and whether AFTER's TPOT
              lies in it); ``bound`` (gpu / host); the kernel-only answer the step model replaced
              and its error, and the launch-timeline lower bound; what the prediction ``assumes``,
              its range over the fix's other outcomes (``predicted_range_ms``, ``within_range``), and
              the assumption checked: the summed change of the ops on both sides (the kernels the
              prediction held constant) and the error once their measured times are put in; the
              host's CPU step range on each side (``host_step_ms``) and ``host_work_added`` when
              AFTER's is much longer (the fix added host work the prediction assumed away)
    change    the noise around step and TPOT: per side the spread (n, min, p10, median, p90, max) of
              the per-step times (and of the per-request TPOTs, when the run folders have them), the
              change of the median with its bootstrap interval and a verdict: improved / regressed /
              no change within a noise threshold (``perfscope.analysis.change``)
    moved_together  ops the fixed findings were not expected to change (not their changed kernels)
              whose time per launch moved the same way by more than 20%, most of those ops' time:
              the machine (its load, its clocks) changed between the runs, and the step's change is
              not all the fix's; None when they did not
    setup     GPU, model, world size, ranks, analysed phase on each side; ``differs`` when they are not
              the same (comparing them is allowed, the report flags it); config/version differences listed
    verdict   one sentence

Both sides are summarised from their primary rank (the slowest decode rank: a TP step waits for it).
"""

from __future__ import annotations

from typing import Any, Optional

from perfscope.analysis import change as chg
from perfscope.analysis.gpus import device_label
from perfscope.analysis.result import Diagnosis

SCHEMA_VERSION = 1

# Server settings worth showing when they differ (the fix usually changes one of these).
CONFIG_KEYS = ("model_path", "dtype", "quantization", "kv_cache_dtype", "attention_backend",
               "decode_attention_backend", "tp_size", "ep_size", "dp_size", "page_size", "disable_cuda_graph",
               "cuda_graph_max_bs", "disable_custom_all_reduce", "disable_overlap_schedule",
               "chunked_prefill_size", "sampling_backend", "max_total_num_tokens")


def _r(x: Optional[float], nd: int = 4) -> Optional[float]:
    return None if x is None else round(float(x), nd)


def _ratio(before: Optional[float], after: Optional[float]) -> Optional[float]:
    if not before or after is None:
        return None
    return round(after / before, 4)


def _server_info(d: Diagnosis, config: Optional[dict] = None) -> dict:
    info = dict((d.run or {}).get("server_info") or {})
    info.update(config or {})
    return info


def _model(d: Diagnosis, info: dict) -> Optional[str]:
    return info.get("model_path") or info.get("served_model_name") or ((d.run or {}).get("workload") or {}).get("model")


def _world_size(d: Diagnosis, info: dict) -> Optional[int]:
    ws = d.primary.meta.get("world_size")
    if ws:
        return int(ws)
    tp = info.get("tp_size")
    if tp:
        return int(tp) * int(info.get("dp_size") or 1) * int(info.get("pp_size") or 1)
    return None


def side_summary(d: Diagnosis, label: str, config: Optional[dict] = None) -> dict:
    """What one side of the comparison was: where it came from, on what, and its headline numbers."""
    p = d.primary
    info = _server_info(d, config)
    timings = d.timings
    files = [r.file for r in d.ranks]
    return {
        "label": label,
        "files": files,
        "device": p.meta.get("device_name"),
        "device_label": device_label(p.meta) or ("CPU" if p.steps.get("analysed_on") == "cpu-ops" else None),
        "analysed_on": p.steps.get("analysed_on") or "gpu-kernels",
        "compute_capability": p.meta.get("compute_capability"),
        # the trace meta defaults to "cuda"; a CPU-only trace analysed on its ops ran on no GPU platform
        "platform": "cpu" if p.steps.get("analysed_on") == "cpu-ops" else p.meta.get("platform"),
        "model": _model(d, info),
        "world_size": _world_size(d, info),
        "ranks": len(d.ranks),
        "primary_rank": p.rank,
        "phase": p.steps.get("phase"),
        "step_method": p.steps.get("method"),
        "step_count": p.steps.get("count"),
        "step_ms": p.steps.get("median_ms"),
        "kernel_ms_per_step": p.kernel_ms_per_step,
        "idle_ms_per_step": p.idle_ms_per_step,
        "tpot_ms": timings.get("tpot_ms"),
        "ttft_ms": timings.get("ttft_ms"),
        "tpot_source": timings.get("source"),
        "tpot_samples_ms": timings.get("tpot_samples_ms"),
        "versions": (d.run or {}).get("versions") or {},
        "config": {k: info[k] for k in CONFIG_KEYS if k in info},
        "findings": [f["id"] for f in p.findings],
    }


def _setup(b: dict, a: dict) -> dict:
    """Differences that make the comparison questionable (flagged) and ones that are the point (listed)."""
    flagged = []
    for key, what in (("device", "GPU"), ("compute_capability", "compute capability"), ("model", "model"),
                      ("world_size", "world size"), ("ranks", "trace files (ranks)"), ("phase", "analysed phase"),
                      ("platform", "platform")):
        x, y = b.get(key), a.get(key)
        if x is not None and y is not None and x != y:
            flagged.append({"field": key, "what": what, "before": x, "after": y})
    config = []
    for k in sorted(set(b["config"]) | set(a["config"])):
        x, y = b["config"].get(k), a["config"].get(k)
        if x != y and k != "model_path":
            config.append({"field": k, "before": x, "after": y})
    versions = []
    for k in sorted(set(b["versions"]) | set(a["versions"])):
        x, y = b["versions"].get(k), a["versions"].get(k)
        if x != y:
            versions.append({"field": k, "before": x, "after": y})
    warnings = [f"different {f['what']}: {f['before']} vs {f['after']}" for f in flagged]
    if b.get("step_method") and a.get("step_method") and b["step_method"] != a["step_method"]:
        warnings.append(f"steps found differently: {b['step_method']} vs {a['step_method']}")
    return {"differs": bool(flagged), "flagged": flagged, "config": config, "versions": versions,
            "warnings": warnings}


def _buckets(pb: dict, pa: dict) -> list[dict]:
    rows = []
    for name in list(dict.fromkeys(list(pb) + list(pa))):
        b = pb.get(name) or {"ms_per_step": 0.0, "share": 0.0}
        a = pa.get(name) or {"ms_per_step": 0.0, "share": 0.0}
        if not b["ms_per_step"] and not a["ms_per_step"]:
            continue
        rows.append({"bucket": name, "before_ms": _r(b["ms_per_step"]), "after_ms": _r(a["ms_per_step"]),
                     "delta_ms": _r(a["ms_per_step"] - b["ms_per_step"]),
                     "ratio": _ratio(b["ms_per_step"], a["ms_per_step"]),
                     "before_share": _r(b["share"]), "after_share": _r(a["share"]),
                     "delta_share": _r(a["share"] - b["share"])})
        if "exposed_ms_per_step" in b or "exposed_ms_per_step" in a:  # communication on a GPU timeline
            eb, ea = b.get("exposed_ms_per_step", 0.0), a.get("exposed_ms_per_step", 0.0)
            rows[-1].update({"before_exposed_ms": _r(eb), "after_exposed_ms": _r(ea), "delta_exposed_ms": _r(ea - eb)})
    rows.sort(key=lambda r: -abs(r["delta_ms"]))
    return rows


def _findings(fb: list[dict], fa: list[dict]) -> dict:
    ib = {f["id"]: f for f in fb}
    ia = {f["id"]: f for f in fa}

    def brief(f: dict) -> dict:
        return {"id": f["id"], "title": f.get("title"), "summary": f.get("summary"),
                "ms_per_step": _r(f.get("ms_per_step")), "share": _r(f.get("share")),
                "confidence": f.get("confidence"), "fix": f.get("fix")}

    return {
        "gone": [brief(ib[k]) for k in ib if k not in ia],
        "new": [brief(ia[k]) for k in ia if k not in ib],
        "kept": [{**brief(ia[k]), "before_ms": _r(ib[k].get("ms_per_step")), "after_ms": _r(ia[k].get("ms_per_step"))}
                 for k in ia if k in ib],
    }


def _unchanged_check(ob: list[dict], oa: list[dict], changed: list[str]) -> Optional[dict]:
    """What a kernel-level prediction assumes and AFTER can check: the ops on both sides that the fix
    does not change (``changed``: the kernel names it does) keep their time. Their summed change per
    step, and the largest."""
    skip = set(changed)
    kb = _ops_by_key([o for o in ob if o.get("name") not in skip])
    ka = _ops_by_key([o for o in oa if o.get("name") not in skip])
    both = [k for k in kb if k in ka]
    if not both:
        return None
    deltas = sorted(((ka[k]["ms"] - kb[k]["ms"], k) for k in both), key=lambda x: -abs(x[0]))
    return {"delta_ms": sum(d for d, _ in deltas),
            "largest": [{"short": k[0], "bucket": k[1], "before_ms": _r(kb[k]["ms"]), "after_ms": _r(ka[k]["ms"]),
                         "delta_ms": _r(d)} for d, k in deltas[:3]]}


def _predictions(fb: list[dict], fa: list[dict], step_before: Optional[float], step_after: Optional[float],
                 tpot_before: Optional[float], tpot_after: Optional[float],
                 ops: Optional[tuple] = None, host: Optional[tuple] = None, after_unprofiled: bool = False,
                 gpu_after: Optional[float] = None) -> list[dict]:
    """Predictions held to account: what BEFORE said the step would take once each of its findings
    was fixed, against what AFTER measured (for the findings AFTER no longer has). A prediction with
    the host's unprofiled time in it (``prediction.host``, perfscope.analysis.hosttime) is of the TPOT
    without the profiler: it is held to AFTER's bench when AFTER has one (``error_pct``), else to the
    profiled step, said as such (``measured_under_profiler``), with its GPU work held to AFTER's."""
    after_ids = {f["id"] for f in fa}
    out = []
    for f in fb:
        pred = f.get("predicted_step_ms_after_fix")
        if f["id"] in after_ids or pred is None or pred <= 0 or not step_after:
            continue  # (a predicted step of 0 ms: the finding's time was the whole step, no prediction)
        if step_before and pred >= 0.99 * step_before:
            continue  # it predicted no faster step (host-side bubbles lie between steps): nothing to hold it to
        if step_before and step_after > 1.05 * step_before and f.get("share_of") == "the step cycle":
            # an idle-time finding (a share of the step cycle) that left because the step grew around the same
            # idle (e.g. a slower kernel mix), not because its cause was fixed: nothing to hold it to
            continue
        row = {"finding": f["id"], "predicted_step_ms": _r(pred), "measured_step_ms": _r(step_after),
               "error_pct": round((pred - step_after) / step_after * 100, 1)}
        model = (f.get("evidence") or {}).get("prediction") or {}  # the step model's parts (stepmodel.py)
        if model.get("bound"):
            row["bound"] = model["bound"]
        if "host" in model:  # a prediction of the unprofiled TPOT
            if model.get("gpu_work_ms") and gpu_after:
                row.update({"predicted_gpu_work_ms": _r(model["gpu_work_ms"]), "measured_gpu_work_ms": _r(gpu_after),
                            "gpu_work_error_pct": round((model["gpu_work_ms"] - gpu_after) / gpu_after * 100, 1)})
            lo, hi = model.get("range_ms") or (pred, pred)
            if tpot_after and after_unprofiled:
                row.update({"predicted_tpot_ms": _r(pred), "measured_tpot_ms": _r(tpot_after),
                            "error_pct": round((pred - tpot_after) / tpot_after * 100, 1),
                            "tpot_error_pct": round((pred - tpot_after) / tpot_after * 100, 1),
                            "predicted_tpot_range_ms": [_r(lo), _r(hi)], "tpot_within_range": lo <= tpot_after <= hi})
            else:
                row["measured_under_profiler"] = True
        elif tpot_before and tpot_after and step_before:
            ptpot = tpot_before * pred / step_before  # the step's saving, carried to the client's TPOT
            row.update({"predicted_tpot_ms": _r(ptpot), "measured_tpot_ms": _r(tpot_after),
                        "tpot_error_pct": round((ptpot - tpot_after) / tpot_after * 100, 1)})
        meas = tpot_after if ("host" in model and tpot_after and after_unprofiled) else step_after
        if model.get("kernel_only_prediction_ms") is not None:  # the kernel-only answer it replaced
            ko = model["kernel_only_prediction_ms"]
            row.update({"kernel_only_ms": _r(ko), "kernel_only_error_pct": round((ko - meas) / meas * 100, 1)})
        if model.get("lower_bound_ms") is not None:
            row["lower_bound_ms"] = _r(model["lower_bound_ms"])
        if model.get("range_ms"):
            lo, hi = model["range_ms"]
            row.update({"predicted_range_ms": [_r(lo), _r(hi)],
                        "within_range": lo * 0.95 <= meas <= hi * 1.05,
                        "alternatives": {k: _r(v["predicted_step_ms"]) for k, v in (model.get("alternatives") or {}).items()}})
        if model.get("assumes"):
            row["assumes"] = model["assumes"]
        unchanged = _unchanged_check(ops[0], ops[1], model["changed_kernels"]) \
            if ops is not None and "changed_kernels" in model else None
        if unchanged is not None:
            # the kernels the prediction held constant, as AFTER measured them: the part of the error
            # that is a broken assumption (another kernel got slower), not the step model
            d = unchanged["delta_ms"]
            row.update({"unchanged_kernels_delta_ms": _r(d), "unchanged_kernels_largest": unchanged["largest"]})
            if model.get("bound") == "gpu" and str(model.get("launch_bound_steps", "")).startswith("0/"):
                # a GPU-bound step moves with its kernels (a launch- or host-bound one does not)
                row["error_with_measured_kernels_pct"] = round((pred + d - meas) / meas * 100, 1)
        if host and host[0] and host[1]:
            # the other half of the assumption: the host's own time per step (its CPU step range),
            # which a GPU-side fix leaves alone; a fix that adds host work (Python, launches) breaks it
            row["host_step_ms"] = [_r(host[0]), _r(host[1])]
            row["host_work_added"] = host[1] > 1.2 * host[0] and host[1] - host[0] > 0.1 * step_after
        out.append(row)
    return out


def _ops_by_key(ops: list[dict]) -> dict:
    """Ops summed by (short name, bucket): what a reader sees as "the same op" on both sides."""
    out: dict[tuple, dict] = {}
    for o in ops:
        key = (o.get("short") or o.get("name"), o.get("bucket"))
        cur = out.get(key)
        if cur is None:
            out[key] = {"short": key[0], "bucket": key[1], "sub": o.get("sub"), "ms": o.get("ms_per_step") or 0.0,
                        "count": o.get("count_per_step") or 0.0, "grid": o.get("grid")}
        else:
            cur["ms"] += o.get("ms_per_step") or 0.0
            cur["count"] += o.get("count_per_step") or 0.0
    return out


def _ops(ob: list[dict], oa: list[dict], limit: int) -> list[dict]:
    kb, ka = _ops_by_key(ob), _ops_by_key(oa)
    rows = []
    for key in list(dict.fromkeys(list(kb) + list(ka))):
        b, a = kb.get(key), ka.get(key)
        bms, ams = (b or {}).get("ms", 0.0), (a or {}).get("ms", 0.0)
        status = "gone" if a is None else "new" if b is None else "changed"
        rows.append({"short": key[0], "bucket": key[1], "sub": (a or b).get("sub"), "status": status,
                     "before_ms": _r(bms) if b else None, "after_ms": _r(ams) if a else None,
                     "delta_ms": _r(ams - bms), "ratio": _ratio(bms, ams) if a and b else None,
                     "before_count": _r((b or {}).get("count"), 2) if b else None,
                     "after_count": _r((a or {}).get("count"), 2) if a else None,
                     "before_grid": (b or {}).get("grid"), "after_grid": (a or {}).get("grid")})
    rows.sort(key=lambda r: -abs(r["delta_ms"] or 0.0))
    return rows[:limit]


MOVED = 1.2  # an op "moved" when its time per launch changed by this factor or more
MOVED_SHARE = 0.6  # ... and ops that moved one way hold this share of the unexpected ops' time


def step_samples(r) -> list[float]:
    """The per-step times the step median is taken over (GPU work of steps that launched
    kernels; else each step's CPU range), as the analysis computes it."""
    gpu = [m["gpu_ms"] for m in r.per_step if m.get("kernels")]
    return gpu or [m["cpu_ms"] for m in r.per_step]


def _moved_together(ob: list[dict], oa: list[dict], expected: set, step_before: Optional[float]) -> Optional[dict]:
    """Ops the fix was not expected to change (not in ``expected``, by kernel name) that moved
    together: one direction, by MOVED or more per launch, MOVED_SHARE of those ops' time, at least
    two ops and a tenth of the step. A fix changes its own kernels; when the others all move, the
    machine did."""
    kb = _ops_by_key([o for o in ob if o.get("name") not in expected])
    ka = _ops_by_key([o for o in oa if o.get("name") not in expected])
    rows = []
    for k in kb:
        if k not in ka:
            continue
        b, a = kb[k], ka[k]
        if b["ms"] <= 0 or a["ms"] <= 0 or not b["count"] or not a["count"]:
            continue
        rows.append((b["ms"], (a["ms"] / a["count"]) / (b["ms"] / b["count"]), k))
    total = sum(w for w, _, _ in rows)
    if len(rows) < 2 or not total or (step_before and total < 0.1 * step_before):
        return None
    for way, test in (("faster", lambda r: r <= 1 / MOVED), ("slower", lambda r: r >= MOVED)):
        moved = [(w, r, k) for w, r, k in rows if test(r)]
        share = sum(w for w, _, _ in moved) / total
        if len(moved) >= 2 and share >= MOVED_SHARE:
            ratios = sorted(r for _, r, _ in moved)
            med = ratios[len(ratios) // 2]
            return {"direction": way, "ops": len(moved), "of_ops": len(rows), "share_of_time": round(share, 3),
                    "median_factor": round(1 / med if way == "faster" else med, 2),
                    "examples": [k[0] for _, _, k in sorted(moved, key=lambda x: -x[0])[:3]]}
    return None


def _fmt(ms: Optional[float]) -> str:
    if ms is None:
        return "?"
    return f"{ms:.3f}" if abs(ms) < 1 else f"{ms:.2f}" if abs(ms) < 100 else f"{ms:.1f}"


def change_words(c: Optional[dict]) -> str:
    """``improved, 95% CI -66% to -64%`` (or ``no change within +-5%, ...``): the verdict of a
    :func:`perfscope.analysis.change.median_change`, short."""
    if not c or not c.get("verdict"):
        return (c or {}).get("why") or ""
    lo, hi = c["interval"]
    v = c["verdict"] if c["verdict"] != "no change" else f"no change (noise +-{c['noise']:.0%})"
    return f"{v}, {c['confidence']:.0%} CI {lo:+.1%} to {hi:+.1%}"


def _verdict(step: dict, buckets: list[dict], findings: dict, setup: dict, change: Optional[dict] = None,
             moved: Optional[dict] = None) -> str:
    b, a = step["before_ms"], step["after_ms"]
    words = change_words((change or {}).get("step"))
    if not b or a is None:
        head, how = "step time not comparable (no timed steps on one side)", ""
    elif a < b:
        head, how = f"decode step {_fmt(b)} ms -> {_fmt(a)} ms", f"{b / a:.2f}x faster" if a else ""
    elif a > b:
        head, how = f"decode step {_fmt(b)} ms -> {_fmt(a)} ms", f"{a / b:.2f}x slower"
    else:
        head, how = f"decode step unchanged at {_fmt(b)} ms", ""
    if b and a is not None and (how or words):
        head += " (" + ": ".join(x for x in (how, words) if x) + ")"
    parts = [head]
    if moved:
        parts.append(f"the machine changed between runs? {moved['ops']} ops the fix was not expected to change "
                     f"moved together ({moved['median_factor']:.2f}x {moved['direction']})")
    if buckets and abs(buckets[0]["delta_ms"]) >= 0.01:
        top = buckets[0]
        parts.append(f"{top['bucket']} {'+' if top['delta_ms'] > 0 else ''}{_fmt(top['delta_ms'])} ms/step")
    if findings["gone"]:
        parts.append("gone: " + ", ".join(f["id"] for f in findings["gone"]))
    if findings["new"]:
        parts.append("new: " + ", ".join(f["id"] for f in findings["new"]))
    if setup["differs"]:
        parts.append("setups differ: " + ", ".join(f["what"] for f in setup["flagged"]))
    return "; ".join(parts)


def compare(before: Diagnosis, after: Diagnosis, *, labels: tuple[str, str] = ("before", "after"),
            configs: tuple[Optional[dict], Optional[dict]] = (None, None), top_ops: int = 15,
            tpot_samples: Optional[tuple[Optional[list], Optional[list]]] = None) -> dict[str, Any]:
    """The data diff of two diagnoses (see the module docstring for the keys). ``tpot_samples``:
    the per-request TPOTs of each side (a run folder's bench.json), when its run.json lacks them."""
    pb, pa = before.primary, after.primary
    sb = side_summary(before, labels[0], configs[0])
    sa = side_summary(after, labels[1], configs[1])
    bms, ams = sb["step_ms"], sa["step_ms"]
    step = {"before_ms": _r(bms), "after_ms": _r(ams),
            "delta_ms": _r(ams - bms) if bms is not None and ams is not None else None,
            "ratio": _ratio(bms, ams),
            "speedup": round(bms / ams, 4) if bms and ams else None}
    tb, ta = sb["tpot_ms"], sa["tpot_ms"]
    tpot = None
    if tb is not None or ta is not None:
        tpot = {"before_ms": _r(tb), "after_ms": _r(ta),
                "delta_ms": _r(ta - tb) if tb is not None and ta is not None else None,
                "ratio": _ratio(tb, ta), "speedup": round(tb / ta, 4) if tb and ta else None}
    idle = {"before_ms": _r(pb.idle_ms_per_step), "after_ms": _r(pa.idle_ms_per_step),
            "delta_ms": _r((pa.idle_ms_per_step or 0.0) - (pb.idle_ms_per_step or 0.0))}
    buckets = _buckets(pb.buckets, pa.buckets)
    findings = _findings(pb.findings, pa.findings)
    setup = _setup(sb, sa)
    change = {"step": chg.median_change(step_samples(pb), step_samples(pa))}
    samples = (tpot_samples[0] if tpot_samples else None) or sb.get("tpot_samples_ms"), \
        (tpot_samples[1] if tpot_samples else None) or sa.get("tpot_samples_ms")
    if samples[0] and samples[1]:
        change["tpot"] = chg.median_change(samples[0], samples[1])
    after_ids = {f["id"] for f in pa.findings}
    expected = {k for f in pb.findings if f["id"] not in after_ids
                for k in ((f.get("evidence") or {}).get("prediction") or {}).get("changed_kernels") or []}
    moved = _moved_together(pb.ops, pa.ops, expected, bms)
    return {
        "tool": "perfscope",
        "kind": "compare",
        "schema_version": SCHEMA_VERSION,
        "before": sb,
        "after": sa,
        "step": step,
        "tpot": tpot,
        "idle": idle,
        "kernel_ms_per_step": {"before_ms": _r(pb.kernel_ms_per_step), "after_ms": _r(pa.kernel_ms_per_step),
                               "delta_ms": _r(pa.kernel_ms_per_step - pb.kernel_ms_per_step)},
        "buckets": buckets,
        "findings": findings,
        "predictions": _predictions(pb.findings, pa.findings, bms, ams, tb, ta, (pb.ops, pa.ops),
                                    (pb.steps.get("cpu_median_ms"), pa.steps.get("cpu_median_ms")),
                                    after_unprofiled=sa.get("tpot_source") == "bench",
                                    gpu_after=pa.kernel_ms_per_step),
        "ops": _ops(pb.ops, pa.ops, top_ops),
        "change": change,
        "moved_together": moved,
        "setup": setup,
        "verdict": _verdict(step, buckets, findings, setup, change, moved),
    }
