"""`perfscope fix ... --apply --restart-cmd CMD`: measure, apply, restart, wait healthy,
re-measure, record before/after in a run folder. If the server does not come back healthy, the
patch is reverted, the server restarted again, and the result says so (Failed, exit 1).

CMD runs on the host with ``sh -c`` and must return once the server is (re)started, e.g.
``systemctl restart sglang`` or ``docker restart sglang``, or a script that stops the old
process and starts a new one in the background on the same port. Its stdin is /dev/null and its
output goes to a temporary file on the host (the last lines are shown when it fails), so a
server it leaves running in the background never holds the command open.

The sequence:

1. check the patch (nothing written); when it would not apply (already applied, refused,
   skipped) stop there: nothing is measured or restarted;
2. measure the server as it runs (``perfscope.bench.measure``): ``before/bench.json``;
3. apply (refused if the file changed during the measurement), ``fix.diff``;
4. run CMD, then wait until ``/health`` answers: CMD and the wait together get
   ``health_timeout`` seconds; when the process on ``--port`` can be seen, the one answering
   must not be the one that served before CMD (a CMD that failed to stop the old server leaves
   it answering, and the new one cannot bind the port);
5. measure again: ``after/bench.json``. A benchmark that fails counts as an unhealthy server;
6. decide on the change of the TPOT median and its bootstrap interval
   (:mod:`perfscope.analysis.change`), never on one noisy number: both sides are measured in
   rounds of ``num_requests`` (the same prompts round by round), BEFORE until its median is known
   to +-5%, AFTER until the interval of the change lies wholly above ``max_slowdown`` (slower:
   revert) or wholly at or below it (keep), each side at most ``max_requests``. Undecided at the
   bound: the patch stays, the record says so, and the command ends ``Failed`` (exit 1) with the
   interval, for the user to decide (``--revert`` undoes it). A fix kept only when it is faster by
   more than its ``keep_only_if_faster`` (a fraction: untuned-fused-moe's 2%) is measured and decided
   against that gain instead (``verdict.bar``), and reverted unless the gain is shown, undecided
   included (``verdict.keep_or_revert``);
7. unhealthy, or surely slower than before by more than ``max_slowdown`` (default 10%):
   revert the file byte for byte, run CMD again and wait again (the same bound), and end
   ``Failed`` with one line saying what happened and whether the server answers again;
8. reverted as slower: measure the original once more (``again/bench.json``, an A-B-A design,
   see :func:`blame`): when it is as slow as the patched server was, the host moved (background
   load, drift), not necessarily the patch, and the line says so.

``restart.json`` (the record: command, TPOT before/after, healthy, reverted, ...) and ``fix.json``
(the final report) are written last, atomically, whatever the outcome; nothing in the run folder
is ever half-written.

Running CMD and waiting for ``/health``: :mod:`perfscope.fixengine.server_restart`; the measurements and
the keep-or-revert and blame decisions: :mod:`perfscope.fixengine.verdict`.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Callable, Optional

from perfscope.errors import InputError, PerfscopeError
from perfscope.fixengine.check import Planned, check
from perfscope.fixengine.host import FixHost
from perfscope.fixengine.model import Environment, Failed, FixModule
from perfscope.fixengine.options import BenchSpec, RestartOptions
from perfscope.fixengine.patch import apply
from perfscope.fixengine.request import FixRequest, Report
from perfscope.fixengine.restore import revert
from perfscope.fixengine.server_restart import restart, server_pid
from perfscope.fixengine.verdict import (
    after_decided,
    before_known,
    blame,
    keep_or_revert,
    measure,
    samples,
    store,
    tpot,
)
from perfscope.util.files import atomic_write_text

__all__ = ["BenchSpec", "RestartOptions", "apply_with_restart"]

RESTART_FILE = "restart.json"


def apply_with_restart(
    fix: FixModule,
    host: FixHost,
    req: FixRequest,
    env: Environment,
    opts: RestartOptions,
    *,
    log: Callable[[str], None] = print,
    planned: Optional[Planned] = None,
) -> Report:
    """Check, measure, apply, restart, measure again; keep or revert. The check is made once (or
    ``planned``, made with this ``env``): what it computed is what the apply writes. ``opts.baseline``
    fresh: restart the unpatched server before measuring it, so that both sides are measured on a fresh
    process (auto: when the fix was given a trace of this server, which left CUPTI attached to the
    traced process: on the H200 the traced MoE server measured 2.26 ms at 16 requests where fresh ones
    measured 1.66-1.92 ms, and a tuned config was kept for a 6% "gain" that was the restart's)."""
    from perfscope.remote.sglang_api import SGLangClient

    if not req.server_url:
        raise InputError("--restart-cmd needs the server's HTTP API: --url (local) or --host with --port")
    cmd, health_timeout, max_slowdown, spec = opts.cmd, opts.health_timeout, opts.max_slowdown, opts.bench
    out = opts.out or Path(f"perfscope-fix-{time.strftime('%Y%m%d-%H%M%S')}")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise InputError(f"--out {out} exists and is not an empty folder")
    t0 = time.monotonic()
    client = SGLangClient(req.server_url, api_key=req.api_key, timeout=60)
    argv = [
        "perfscope",
        "fix",
        fix.id,
        "--apply",
        "--restart-cmd",
        cmd,
        "--bench-input-len",
        str(spec.input_len),
        "--bench-output-len",
        str(spec.output_len),
        "--bench-requests",
        str(spec.num_requests),
        "--bench-max-requests",
        str(spec.max_requests),
        "--bench-concurrency",
        str(spec.concurrency),
    ]

    # 1. check: only a patch that will be written is worth measuring and restarting for
    planned = planned or check(fix, host, req, env)
    rep = planned.report
    out.mkdir(parents=True, exist_ok=True)
    record: dict = {
        "restart_cmd": cmd,
        "health_timeout_s": health_timeout,
        "max_slowdown": max_slowdown,
        "url": req.server_url,
        "host": host.label,
        "workload": dataclasses.asdict(spec),
        "before": None,
        "after": None,
        "healthy": None,
        "reverted": None,
        "healthy_after_revert": None,
    }

    def finish(rep: Report) -> Report:
        rep.extra["run_dir"] = str(out)
        record.update(
            outcome=rep.outcome.kind,
            reason=rep.outcome.reason,
            tpot_ms_before=tpot(record["before"]),
            tpot_ms_after=tpot(record["after"]),
            seconds=round(time.monotonic() - t0, 1),
        )
        b, a = record["tpot_ms_before"], record["tpot_ms_after"]
        record["speedup"] = round(b / a, 2) if b and a else None
        rep.extra["restart"] = record
        atomic_write_text(out / RESTART_FILE, json.dumps(record, indent=2, default=str) + "\n", shared=True)
        atomic_write_text(out / "fix.json", json.dumps(rep.to_dict(), indent=2, default=str) + "\n", shared=True)
        return rep

    if planned.after is None:
        rep.notes.append("nothing was applied, so the server was neither measured nor restarted")
        return finish(rep)

    # 2. before, on a fresh process when asked (or when this server was traced)
    fresh_baseline = opts.fresh_baseline
    if fresh_baseline is None:
        fresh_baseline = bool((req.facts or {}).get("trace"))
    if fresh_baseline:
        log(f"restarting the unpatched server first (a fresh process to measure, as the patched one will be): {cmd}")
        ok, why = restart(host, cmd, client, health_timeout, port=req.port, old_pid=server_pid(host, req.port))
        record["baseline_restart"] = {"ok": ok, "why": why or None}
        if not ok:
            rep.outcome = Failed(f"the restart before measuring failed ({why}); nothing was patched")
            return finish(rep)
    info = client.server_info()
    log(
        f"measuring before the patch (rounds of {spec.num_requests} requests until its TPOT median is known to "
        f"+-5%, at most {max(spec.max_requests, spec.num_requests)}; in={spec.input_len} out={spec.output_len}) ..."
    )
    res = measure(client, info, spec, host, before_known)
    record["before"] = store(out / "before", res, client.base_url, host, info, argv)
    record["before_samples_ms"] = samples(res)

    # 3. apply, refused if the file changed while we measured
    areq = dataclasses.replace(req, expect_sha256=req.expect_sha256 or rep.sha256_before)
    rep = apply(fix, host, areq, env, planned=planned)
    if rep.outcome.kind != "applied":
        return finish(rep)
    atomic_write_text(out / "fix.diff", rep.diff or "", shared=True)
    try:
        return _restart_and_verify(
            fix, host, req, env, cmd, rep, record, finish, client, spec, argv, out, health_timeout, log, max_slowdown
        )
    except BaseException as e:  # Ctrl-C (or worse) after the patch was written: the record says where it stands
        record["stopped_by"] = type(e).__name__
        rep.notes.append(
            f"stopped ({type(e).__name__}) before the restart was verified: {rep.path} is "
            + (
                "the original again"
                if record.get("reverted")
                else f"still patched (undo with perfscope fix {fix.id} --revert)"
            )
        )
        finish(rep)
        raise


def _restart_and_verify(
    fix, host, req, env, cmd, rep, record, finish, client, spec, argv, out, health_timeout, log, max_slowdown=0.10
):
    # 4. restart and 5. measure again
    log(f"restarting the server: {cmd} (healthy within {health_timeout:g}s, or the patch is reverted)")
    ok, why = restart(host, cmd, client, health_timeout, port=req.port, old_pid=server_pid(host, req.port))
    if ok:
        try:
            info2 = client.server_info()
            log("healthy; measuring after the patch (rounds until the change is decided) ...")
            # rounds until decided against the bar the decision below uses (a gain, when the fix has one)
            enough = after_decided(record["before_samples_ms"], max_slowdown, getattr(fix, "keep_only_if_faster", 0.0))
            res2 = measure(client, info2, spec, host, enough)
        except PerfscopeError as e:
            ok, why = False, f"healthy, but the benchmark failed: {e}"
        else:
            record["after"] = store(out / "after", res2, client.base_url, host, info2, argv)
            record["after_samples_ms"] = samples(res2)
    record["healthy"] = ok
    slower = False
    if ok:
        from perfscope.analysis.change import describe

        # a fix kept only when it is faster beyond the noise (keep_only_if_faster: a fraction) decides
        # against that gain; any other against --max-slowdown
        gain = getattr(fix, "keep_only_if_faster", 0.0)
        decision, c = keep_or_revert(record["before_samples_ms"], record["after_samples_ms"], max_slowdown, gain)
        record["change"] = c
        record["decision"] = decision or "undecided"
        said = describe(c)
        if decision == "revert":
            slower = True
            why = (
                f"{said}; not faster by more than {gain:.0%} beyond the noise: {fix.id} keeps its change only "
                "when it is"
                if gain
                else f"{said}; surely more than --max-slowdown {max_slowdown:.0%} slower"
            )
        elif decision == "keep":
            rep.notes.append(
                f"{said}; kept ("
                + (
                    f"faster by more than {gain:.0%}"
                    if gain
                    else f"not more than --max-slowdown {max_slowdown:.0%} slower"
                )
                + f"); run folder {out}"
            )
            return finish(rep)
        else:
            rep.outcome = Failed(
                f"undecided after {c['before']['n']} + {c['after']['n']} requests: {said}; the interval spans "
                f"--max-slowdown {max_slowdown:.0%}, so the patch is neither kept on this evidence nor reverted: "
                f"it stays applied (measure again with perfscope bench; perfscope fix {fix.id} --revert undoes it)"
            )
            return finish(rep)
    record["slower"] = slower

    # 6. unhealthy (or slower): put the original back and restart again
    log(f"server {'slower' if slower else 'unhealthy'} after the patch ({why}); reverting and restarting again")
    try:
        back = revert(fix, host, req, env)
        reverted, rwhy = back.outcome.kind == "reverted", back.outcome.reason
    except PerfscopeError as e:
        reverted, rwhy = False, str(e)
    record["reverted"] = reverted
    ok2, why2 = restart(host, cmd, client, health_timeout)
    record["healthy_after_revert"] = ok2
    what = "the server was slower with the patch" if slower else "the server did not come back healthy with the patch"
    if not reverted:
        rep.outcome = Failed(
            f"{what} ({why}); the revert FAILED "
            f"({rwhy}), the server restarted: " + ("healthy" if ok2 else f"still unhealthy ({why2})")
        )
        return finish(rep)
    rep.sha256_after = rep.sha256_before
    said_again = ""
    if slower and ok2 and not getattr(fix, "keep_only_if_faster", 0.0):
        said_again = _measure_again(client, spec, host, record, out, argv, log, max_slowdown)
    rep.outcome = Failed(
        f"{what} ({why}); the patch was reverted byte for byte "
        "and the server restarted: "
        + ("it answers again" if ok2 else f"STILL UNHEALTHY ({why2}): look at it now")
        + said_again
    )
    return finish(rep)


def _measure_again(
    client, spec: BenchSpec, host: FixHost, record: dict, out: Path, argv: list[str], log, max_slowdown: float
) -> str:
    """The original, back after a revert for slowness, measured once more (``again/bench.json``):
    was the patch slower, or the host? Returns the clause the outcome line ends with."""
    from perfscope.analysis.change import describe

    after = record.get("after_samples_ms") or []
    log("measuring the original again, to tell the patch's slowdown from the host's ...")
    try:
        info = client.server_info()
        res = measure(client, info, spec, host, lambda a: blame(after, a, max_slowdown)[0] is not None)
    except PerfscopeError as e:
        record["blame"] = "unmeasured"
        return f"; the original could not be measured again ({e})"
    record["again"] = store(out / "again", res, client.base_url, host, info, argv)
    record["again_samples_ms"] = samples(res)
    who, c = blame(after, record["again_samples_ms"], max_slowdown)
    record["blame"] = who or "undecided"
    record["change_again"] = c
    said = describe(c, "TPOT median original-again -> patched")
    if who == "patch":
        return f"; the original, measured again, is faster than the patched ({said}): the patch was slower"
    if who == "host":
        return (
            f"; but the original, measured again, is as slow as the patched ({said}): the host got slower "
            "(background load or drift), not necessarily the patch: measure again on a quiet host "
            "(perfscope bench) before trying the fix again"
        )
    return f"; the original, measured again, does not tell the patch from the host ({said})"
