"""`perfscope fix`: check, apply and revert a fix module on the server's source, locally or over SSH (the fix
modules' documents: :mod:`perfscope.cli._fix_doc`)."""

from __future__ import annotations

import functools
import json
import sys
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from perfscope.cli import _apikey, _fix_doc, _fix_options, _help
from perfscope.errors import FixRefused, GateFailed, InputError, PerfscopeError
from perfscope.report.escape import Console, term

if TYPE_CHECKING:
    from perfscope.fixengine.host import FixHost
    from perfscope.fixengine.model import Environment, FixModule
    from perfscope.fixengine.options import FixOptions
    from perfscope.fixengine.request import FixRequest, Report

NAME = "fix"
ORDER = 40


class HELP_CLASS(_help.SubjectHelpCommand):
    subjects = staticmethod(_fix_doc.fix_ids)
    subject_help = staticmethod(_fix_doc.fix_help)
    subject_examples = staticmethod(_fix_doc.fix_examples)


EXAMPLES = _fix_doc.fix_examples("fp8-kv-cast") + [
    ("perfscope fix fp8-kv-cast --help", "that fix's own document: strategies, targets, versions, requirements")
]


def _listening(addr: str, port: int) -> bool:
    import socket

    try:
        with socket.create_connection((addr, port), timeout=1):
            return True
    except OSError:
        return False


@_fix_options.with_options(_fix_options.PARAMS)
def command(o: FixOptions) -> int:
    """Check a fix and show its diff (nothing changes), --apply it, or --revert it.

    The check finds the server's sglang (the interpreter of the process on --port, or --python),
    its version and which known variant the target file is; reads the GPU (nvidia-smi), the
    FlashInfer version and the server's kv_cache_dtype / attention backend; and says which
    strategy applies and why.

    With --apply --restart-cmd CMD: measure the server (perfscope bench), patch, run CMD on the host
    (it must return once the server is restarting on the same port), wait for /health (at most
    --health-timeout seconds from starting CMD), measure again, and record before/ and after/
    bench runs, restart.json and fix.json in --out. If the server does not come back healthy (CMD
    fails, /health does not answer in time, or the benchmark fails), the file is restored byte for
    byte, CMD is run again, and the command exits 1 with one line saying so.

    Launch-flag fixes (eager-decode, overlap-off, nccl-allreduce, torch-sampling,
    chunked-prefill-interference) edit the server's launch command instead: --launch-file F (a shell
    script, a systemd unit's ExecStart=, a compose command:) read as tokens, every other byte kept;
    a command perfscope cannot read exactly is refused (exit 4). Without --launch-file the change and
    the command line the server was started with are printed, nothing is written. --trace RUN lets
    the fix pick its value from the finding (e.g. --cuda-graph-max-bs from the batch sizes seen).
    With --restart-cmd the change is reverted (and the server restarted again) when the server is
    unhealthy or TPOT is surely more than --max-slowdown slower: kept or reverted on the bootstrap
    interval of the TPOT median's change, measured in rounds of --bench-requests until that interval
    decides (at most --bench-max-requests per side), never on one noisy number.

    Examples:

      # the change; nothing written
      perfscope fix eager-decode --trace run1
      # + its diff
      perfscope fix eager-decode --host gpu-box --launch-file run.sh --trace run1
      # edit, restart, measure
      perfscope fix eager-decode --host gpu-box --launch-file run.sh --apply \\
          --restart-cmd 'systemctl restart sglang' --out fix1
      # byte for byte
      perfscope fix eager-decode --host gpu-box --launch-file run.sh --revert

    Exit codes: 0 ok, 1 verification failed (after --restart-cmd: unhealthy or surely slower, the patch
    reverted; or the change undecided at --bench-max-requests, the patch left applied),
    2 bad input, 3 host or server failure, 4 refused or does not apply here (skipped; nothing changed;
    a --revert with nothing to revert exits 0)."""
    if o.list_fixes:
        return _list(o.json_out and not o.doc, o.doc)
    o.check()
    from perfscope.fixengine import engine
    from perfscope.fixengine.kinds import kind_of
    from perfscope.fixengine.registry import get
    from perfscope.fixengine.request import FixRequest

    assert o.fix_id is not None  # o.check() says so
    fix = get(o.fix_id)
    if o.budget is not None:
        if not hasattr(fix, "budget_s"):
            raise InputError(
                f"--budget: {fix.id} spends no GPU time on the server (only untuned-fused-moe's tuning has a bound)"
            )
        if not 10 <= o.budget <= 3600:
            raise InputError(f"--budget {o.budget:g}: expected 10-3600 seconds")
    kind = kind_of(fix)
    kind.check_request(
        fix, FixRequest(target_file=o.target_file, sglang_root=o.sglang_root, launch_file=o.launch_file), o.action
    )
    facts = _facts(o)
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    req = FixRequest(
        strategy=o.strategy,
        target_file=o.target_file,
        sglang_root=o.sglang_root,
        target=o.target,
        python=o.python,
        server_url=o.url,
        api_key=_apikey.read(o.api_key_env),
        port=_port(o, facts, err),
        state_dir=o.state_dir,
        force=o.force,
        expect_sha256=o.expect_sha256,
        overrides=o.overrides(),
        launch_file=o.launch_file,
        facts=facts,
        source_fix=kind.needs_server_code,
    )
    with ExitStack() as stack:
        fhost = _connect(stack, o, req, err)
        env = engine.probe_env(fhost, req)
        rep = _act(o, fix, fhost, req, env, log=functools.partial(err.print, markup=False))
        return _finish(rep, o.json_out, revert=o.revert)


def _facts(o: FixOptions) -> dict[str, Any]:
    """What the fix reads beside the host: the trace's findings, the tuning budget, the measured batch."""
    facts = _trace_facts(o.trace) if o.trace is not None else {}
    if o.budget is not None:
        facts["budget_s"] = float(o.budget)
    if o.restart_cmd:
        facts["bench_concurrency"] = o.bench_concurrency  # the batch the re-measure decodes at
    return facts


def _port(o: FixOptions, facts: dict[str, Any], err: Console) -> int:
    """The server's port: --port, else the traced server's, else 30000."""
    if o.port is not None:
        return o.port
    # the traced server's port, not whatever else listens on 30000 here (another server's process
    # would be described, or restarted, as this run's server)
    rec = (facts.get("server_info") or {}).get("port")
    port = rec if isinstance(rec, int) and not isinstance(rec, bool) and 0 < rec < 65536 else 30000
    if port != 30000:
        err.print(
            f"note: --port {port}, the port recorded for the traced server ({o.trace}); give --port to change it",
            markup=False,
        )
    return port


def _connect(stack: ExitStack, o: FixOptions, req: FixRequest, err: Console) -> FixHost:
    """The server's host, and the server's HTTP API in ``req.server_url`` where it can be reached."""
    from perfscope.fixengine.host import SSHFixHost

    fhost = _open_host(stack, o)
    port = req.port
    if isinstance(fhost, SSHFixHost) and not o.url:
        # the server's HTTP API through the SSH connection, when something listens there
        try:
            fwd = stack.enter_context(fhost.s.forward(port))
            req.server_url = fwd.url
        except PerfscopeError as e:
            err.print(f"note: server info not read over SSH: {e}", markup=False)
    elif not (o.host or o.url or o.target_file or o.sglang_root or o.python) and port and _listening("127.0.0.1", port):
        # a local server on --port, the install not named otherwise: its /server_info says what it
        # runs (kv_cache_dtype, backend, flags), as over SSH; without it a check assumed what the
        # finding implies
        req.server_url = f"http://127.0.0.1:{port}"
    return fhost


def _act(
    o: FixOptions, fix: FixModule, fhost: FixHost, req: FixRequest, env: Environment, log: Callable[[str], None]
) -> Report:
    """Check (with --probe first), apply (and restart) or revert (and restart); the check is made once."""
    from perfscope.fixengine import engine
    from perfscope.fixengine.kinds import kind_of
    from perfscope.fixengine.model import Refused

    restart = o.restart()
    planned = None
    if o.probe and not o.revert:
        from perfscope.fixengine.probe import run_probe

        planned = engine.check(fix, fhost, req, env)
        rep0 = planned.report
        if rep0.strategy and rep0.outcome.kind == "checked":
            probe = run_probe(fix, fhost, env, rep0.strategy)
            if not probe.get("ok"):
                rep0.outcome = Refused(f"probe failed: {probe.get('reason')}")
                rep0.extra["probe"] = probe
                return rep0
            planned.report.extra["probe"] = probe
    if o.revert:
        rep = engine.revert(fix, fhost, req, env)
        if rep.outcome.kind == "reverted":
            from perfscope.fixengine.server_restart import after_revert

            after_revert(fhost, req, rep, restart, what=kind_of(fix).changes, log=log)
    elif o.apply and restart:
        from perfscope.fixengine.restart import apply_with_restart

        rep = apply_with_restart(fix, fhost, req, env, restart, log=log, planned=planned)
    elif o.apply:
        rep = engine.apply(fix, fhost, req, env, planned=planned)
    else:
        rep = (planned or engine.check(fix, fhost, req, env)).report
    return rep


def _list(as_json: bool, markdown: bool) -> int:
    """``--list``: the fix modules, as text, Markdown (``--doc``) or JSON (``--json``)."""
    if as_json:
        from perfscope.fixengine.registry import discover

        sys.stdout.write(json.dumps([f.summary() for _, f in sorted(discover().items())], indent=2) + "\n")
        return 0
    sys.stdout.write(_fix_doc.list_doc(markdown))
    return 0


def _trace_facts(trace: Path) -> dict:
    """The findings (and step numbers) of a trace, for a fix that picks its value from them."""
    from perfscope.cli._diagnosis import build_diagnosis

    d = build_diagnosis([trace]).to_dict()
    si = (d.get("run") or {}).get("server_info")
    return {
        "trace": str(trace),
        "findings": d.get("findings") or [],
        "steps": d.get("steps") or {},
        "server_info": si if isinstance(si, dict) else {},
    }


def _open_host(stack: ExitStack, o: FixOptions) -> FixHost:
    """The server's host: this machine, or ``--host`` over SSH (closed with ``stack``)."""
    from perfscope.fixengine.host import LocalFixHost, SSHFixHost

    if not o.host:
        return LocalFixHost()
    from perfscope.remote.ssh import connect, parse_target

    target = parse_target(
        o.host,
        user=o.ssh_user,
        port=o.ssh_port,
        identity=str(o.identity) if o.identity else None,
        jump=o.jump,
        known_hosts=str(o.known_hosts) if o.known_hosts else None,
        accept_new=o.accept_new_host_key,
    )
    session = stack.enter_context(connect(target))
    return SSHFixHost(session)


def _finish(rep: Report, json_out: bool, revert: bool = False) -> int:
    """Print the report; a fix that was refused, does not apply (skipped; a --revert with nothing
    to revert is not that: exit 0) or failed ends as one error line with its exit code, said once."""
    out = Console(highlight=False, soft_wrap=True)
    kind = rep.outcome.kind
    ends_in_error = kind in ("refused", "failed") or (kind == "skipped" and not revert)
    if json_out:
        sys.stdout.write(json.dumps(rep.to_dict(), indent=2, default=str) + "\n")
    else:
        env = rep.env
        if env is not None:
            facts = [f"host {env.host}"]
            for label, val in (
                ("python", env.python),
                ("sglang", env.sglang_version),
                ("flashinfer", env.flashinfer_version),
                ("GPU", f"{env.gpu_name or '?'} SM{env.compute_cap}" if env.compute_cap else None),
                ("kv_cache_dtype", env.kv_cache_dtype),
                ("backend", env.attention_backend),
            ):
                if val:
                    facts.append(f"{label} {val}")
            out.print("; ".join(facts), markup=False)
        if rep.path:
            out.print(
                f"target: {rep.target} {rep.path}" + (f" (variant {rep.variant})" if rep.variant else ""), markup=False
            )
        for a in rep.anchors:
            out.print(f"  anchor line {a['line']}: {a['what']}", markup=False)
        if rep.strategy:
            out.print(
                f"strategy: {rep.strategy}" + (f": {rep.strategy_reason}" if rep.strategy_reason else ""), markup=False
            )
        for k, v in rep.rejected.items():
            if k != rep.strategy:
                out.print(f"  not {k}: {v}", markup=False)
        for n in rep.notes:
            out.print(f"note: {n}", markup=False)
        if rep.diff and rep.outcome.kind == "checked":
            sys.stdout.write(term(rep.diff, keep="\n\t"))  # the host's file: no control character reaches the terminal
        if not ends_in_error:  # the error line below says it
            out.print(f"{rep.outcome.kind}: {rep.outcome.reason}", markup=False)
        if rep.outcome.kind == "checked" and rep.sha256_before:
            out.print(
                f"sha256 {rep.sha256_before}  (apply with --apply --expect-sha256 {rep.sha256_before})", markup=False
            )
    if kind == "refused":
        raise FixRefused(f"{rep.fix} refused, nothing changed: {rep.outcome.reason}")
    if kind == "skipped" and not revert:
        raise FixRefused(f"{rep.fix} does not apply here, nothing changed (skipped: {rep.outcome.reason})")
    if kind == "failed":
        raise GateFailed(f"{rep.fix} failed: {rep.outcome.reason}")
    return 0
