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
from perfscope.analysis.compare_ops import moved_together, ops_diff, ratio as _ratio, rounded as _r, step_samples
from perfscope.analysis.compare_predictions import held_to_account
from perfscope.analysis.finding import Finding
from perfscope.analysis.gpus import device_label
from perfscope.analysis.result import Diagnosis

SCHEMA_VERSION = 1

# Server settings worth showing when they differ (the fix usually changes one of these).
CONFIG_KEYS = (
    "model_path",
    "dtype",
    "quantization",
    "kv_cache_dtype",
    "attention_backend",
    "decode_attention_backend",
    "tp_size",
    "ep_size",
    "dp_size",
    "page_size",
    "disable_cuda_graph",
    "cuda_graph_max_bs",
    "disable_custom_all_reduce",
    "disable_overlap_schedule",
    "chunked_prefill_size",
    "sampling_backend",
    "max_total_num_tokens",
)


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
        "device_label": device_label(p.meta) or ("CPU" if p.steps.cpu_only else None),
        "analysed_on": p.steps.analysed_on or "gpu-kernels",
        "compute_capability": p.meta.get("compute_capability"),
        # the trace meta defaults to "cuda"; a CPU-only trace analysed on its ops ran on no GPU platform
        "platform": "cpu" if p.steps.cpu_only else p.meta.get("platform"),
        "model": _model(d, info),
        "world_size": _world_size(d, info),
        "ranks": len(d.ranks),
        "primary_rank": p.rank,
        "phase": p.steps.phase,
        "step_method": p.steps.method,
        "step_count": p.steps.count,
        "step_ms": p.steps.median_ms,
        "kernel_ms_per_step": p.kernel_ms_per_step,
        "idle_ms_per_step": p.idle_ms_per_step,
        "tpot_ms": timings.get("tpot_ms"),
        "ttft_ms": timings.get("ttft_ms"),
        "tpot_source": timings.get("source"),
        "tpot_samples_ms": timings.get("tpot_samples_ms"),
        "versions": (d.run or {}).get("versions") or {},
        "config": {k: info[k] for k in CONFIG_KEYS if k in info},
        "findings": [f.id for f in p.findings],
    }


def _setup(b: dict, a: dict) -> dict:
    """Differences that make the comparison questionable (flagged) and ones that are the point (listed)."""
    flagged = []
    for key, what in (
        ("device", "GPU"),
        ("compute_capability", "compute capability"),
        ("model", "model"),
        ("world_size", "world size"),
        ("ranks", "trace files (ranks)"),
        ("phase", "analysed phase"),
        ("platform", "platform"),
    ):
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
    return {"differs": bool(flagged), "flagged": flagged, "config": config, "versions": versions, "warnings": warnings}


def _buckets(pb: dict, pa: dict) -> list[dict]:
    rows = []
    for name in list(dict.fromkeys(list(pb) + list(pa))):
        b = pb.get(name) or {"ms_per_step": 0.0, "share": 0.0}
        a = pa.get(name) or {"ms_per_step": 0.0, "share": 0.0}
        if not b["ms_per_step"] and not a["ms_per_step"]:
            continue
        rows.append(
            {
                "bucket": name,
                "before_ms": _r(b["ms_per_step"]),
                "after_ms": _r(a["ms_per_step"]),
                "delta_ms": _r(a["ms_per_step"] - b["ms_per_step"]),
                "ratio": _ratio(b["ms_per_step"], a["ms_per_step"]),
                "before_share": _r(b["share"]),
                "after_share": _r(a["share"]),
                "delta_share": _r(a["share"] - b["share"]),
            }
        )
        if "exposed_ms_per_step" in b or "exposed_ms_per_step" in a:  # communication on a GPU timeline
            eb, ea = b.get("exposed_ms_per_step", 0.0), a.get("exposed_ms_per_step", 0.0)
            rows[-1].update({"before_exposed_ms": _r(eb), "after_exposed_ms": _r(ea), "delta_exposed_ms": _r(ea - eb)})
    rows.sort(key=lambda r: -abs(r["delta_ms"]))
    return rows


def _findings(fb: list[Finding], fa: list[Finding]) -> dict:
    ib = {f.id: f for f in fb}
    ia = {f.id: f for f in fa}

    def brief(f: Finding) -> dict:
        return {
            "id": f.id,
            "title": f.title,
            "summary": f.summary,
            "ms_per_step": _r(f.ms_per_step),
            "share": _r(f.share),
            "confidence": f.confidence,
            "fix": f.fix,
        }

    return {
        "gone": [brief(ib[k]) for k in ib if k not in ia],
        "new": [brief(ia[k]) for k in ia if k not in ib],
        "kept": [
            {**brief(ia[k]), "before_ms": _r(ib[k].ms_per_step), "after_ms": _r(ia[k].ms_per_step)}
            for k in ia
            if k in ib
        ],
    }


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


def _verdict(
    step: dict,
    buckets: list[dict],
    findings: dict,
    setup: dict,
    change: Optional[dict] = None,
    moved: Optional[dict] = None,
) -> str:
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
        parts.append(
            f"the machine changed between runs? {moved['ops']} ops the fix was not expected to change "
            f"moved together ({moved['median_factor']:.2f}x {moved['direction']})"
        )
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


def compare(
    before: Diagnosis,
    after: Diagnosis,
    *,
    labels: tuple[str, str] = ("before", "after"),
    configs: tuple[Optional[dict], Optional[dict]] = (None, None),
    top_ops: int = 15,
    tpot_samples: Optional[tuple[Optional[list], Optional[list]]] = None,
) -> dict[str, Any]:
    """The data diff of two diagnoses (see the module docstring for the keys). ``tpot_samples``:
    the per-request TPOTs of each side (a run folder's bench.json), when its run.json lacks them."""
    pb, pa = before.primary, after.primary
    sb = side_summary(before, labels[0], configs[0])
    sa = side_summary(after, labels[1], configs[1])
    bms, ams = sb["step_ms"], sa["step_ms"]
    step = {
        "before_ms": _r(bms),
        "after_ms": _r(ams),
        "delta_ms": _r(ams - bms) if bms is not None and ams is not None else None,
        "ratio": _ratio(bms, ams),
        "speedup": round(bms / ams, 4) if bms and ams else None,
    }
    tb, ta = sb["tpot_ms"], sa["tpot_ms"]
    tpot = None
    if tb is not None or ta is not None:
        tpot = {
            "before_ms": _r(tb),
            "after_ms": _r(ta),
            "delta_ms": _r(ta - tb) if tb is not None and ta is not None else None,
            "ratio": _ratio(tb, ta),
            "speedup": round(tb / ta, 4) if tb and ta else None,
        }
    idle = {
        "before_ms": _r(pb.idle_ms_per_step),
        "after_ms": _r(pa.idle_ms_per_step),
        "delta_ms": _r((pa.idle_ms_per_step or 0.0) - (pb.idle_ms_per_step or 0.0)),
    }
    buckets = _buckets(pb.buckets, pa.buckets)
    findings = _findings(pb.findings, pa.findings)
    setup = _setup(sb, sa)
    change = {"step": chg.median_change(step_samples(pb), step_samples(pa))}
    samples = (
        (tpot_samples[0] if tpot_samples else None) or sb.get("tpot_samples_ms"),
        (tpot_samples[1] if tpot_samples else None) or sa.get("tpot_samples_ms"),
    )
    if samples[0] and samples[1]:
        change["tpot"] = chg.median_change(samples[0], samples[1])
    after_ids = {f.id for f in pa.findings}
    expected = {
        k
        for f in pb.findings
        if f.id not in after_ids
        for k in ((f.evidence or {}).get("prediction") or {}).get("changed_kernels") or []
    }
    moved = moved_together(pb.ops, pa.ops, expected, bms)
    return {
        "tool": "perfscope",
        "kind": "compare",
        "schema_version": SCHEMA_VERSION,
        "before": sb,
        "after": sa,
        "step": step,
        "tpot": tpot,
        "idle": idle,
        "kernel_ms_per_step": {
            "before_ms": _r(pb.kernel_ms_per_step),
            "after_ms": _r(pa.kernel_ms_per_step),
            "delta_ms": _r(pa.kernel_ms_per_step - pb.kernel_ms_per_step),
        },
        "buckets": buckets,
        "findings": findings,
        "predictions": held_to_account(
            pb.findings,
            pa.findings,
            bms,
            ams,
            tb,
            ta,
            (pb.ops, pa.ops),
            (pb.steps.cpu_median_ms, pa.steps.cpu_median_ms),
            after_unprofiled=sa.get("tpot_source") == "bench",
            gpu_after=pa.kernel_ms_per_step,
        ),
        "ops": ops_diff(pb.ops, pa.ops, top_ops),
        "change": change,
        "moved_together": moved,
        "setup": setup,
        "verdict": _verdict(step, buckets, findings, setup, change, moved),
    }
