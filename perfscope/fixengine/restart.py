"""`perfscope fix ... --apply --restart-cmd CMD`: measure, apply, restart, wait healthy,
re-measure, record before/after in a run folder. If the server does not come back healthy, the
patch is reverted, the server restarted again, and the result says so (Failed, exit 1).

CMD runs on the host with ``sh -c`` and must return once the server is (re)started, e.g.
``systemctl restart sglang`` or ``docker restart sglang``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable, Optional

from perfscope.errors import InputError, PerfscopeError
from perfscope.fixengine import engine
from perfscope.fixengine.host import FixHost
from perfscope.fixengine.model import Environment, Failed, FixModule
from perfscope.util.files import atomic_write_text


def _measure(client, info) -> Optional[dict]:
    try:
        from perfscope.bench.core import measure
    except ImportError:
        return None
    return measure(client, input_len=256, output_len=64, concurrency=1, num_requests=4, warmup=1,
                   server_info=info).to_dict(per_request=False)


def _restart(host: FixHost, cmd: str, client, timeout: float, log) -> tuple[bool, str]:
    r = host.run_shell(cmd, timeout=600)
    if r.rc != 0:
        return False, f"restart command exited {r.rc}: {(r.stderr or r.stdout).strip()[-300:]}"
    time.sleep(2.0)  # let the old process go before polling /health
    try:
        client.wait_healthy(timeout=timeout, interval=2.0)
    except PerfscopeError as e:
        return False, str(e)
    return True, ""


def apply_with_restart(fix: FixModule, host: FixHost, req: engine.FixRequest, env: Environment, cmd: str, *,
                       health_timeout: float = 900.0, out: Optional[Path] = None,
                       log: Callable[[str], None] = print) -> engine.Report:
    from perfscope.capture.sglang_api import SGLangClient

    if not req.server_url:
        raise InputError("--restart-cmd needs the server's HTTP API: --url (local) or --host with --port")
    client = SGLangClient(req.server_url, timeout=60)
    out = out or Path(f"perfscope-fix-{time.strftime('%Y%m%d-%H%M%S')}")
    if out.exists() and any(out.iterdir()):
        raise InputError(f"--out {out} exists and is not empty")
    out.mkdir(parents=True, exist_ok=True)
    info = client.server_info()
    log("measuring before the patch ...")
    before = _measure(client, info)
    rep = engine.apply(fix, host, req, env)
    atomic_write_text(out / "fix.json", json.dumps(rep.to_dict(), indent=2, default=str) + "\n")
    if rep.outcome.kind != "applied":
        return rep
    atomic_write_text(out / "fix.diff", rep.diff or "")
    log(f"restarting the server: {cmd}")
    ok, why = _restart(host, cmd, client, health_timeout, log)
    record = {"restart_cmd": cmd, "before": before, "after": None, "healthy": ok}
    if not ok:
        log(f"server unhealthy after the patch ({why}); reverting and restarting again")
        back = engine.revert(fix, host, req, env)
        ok2, why2 = _restart(host, cmd, client, health_timeout, log)
        record.update(reverted=back.outcome.kind, healthy_after_revert=ok2)
        atomic_write_text(out / "bench.json", json.dumps(record, indent=2) + "\n")
        rep.outcome = Failed(
            f"the server did not come back healthy with the patch ({why}); the patch was reverted "
            f"({back.outcome.kind}) and the server restarted: "
            + ("healthy again" if ok2 else f"STILL UNHEALTHY ({why2}): look at it now"))
        rep.extra["run_dir"] = str(out)
        return rep
    log("measuring after the patch ...")
    record["after"] = _measure(client, client.server_info())
    atomic_write_text(out / "bench.json", json.dumps(record, indent=2) + "\n")
    rep.extra["run_dir"] = str(out)
    rep.extra["bench"] = record
    b = (before or {}).get("tpot_ms", {}) if before else {}
    a = (record["after"] or {}).get("tpot_ms", {}) if record["after"] else {}
    if isinstance(b, dict) and isinstance(a, dict) and b.get("median") and a.get("median"):
        rep.notes.append(f"TPOT median {b['median']:.2f} ms -> {a['median']:.2f} ms "
                         f"({b['median'] / a['median']:.2f}x); run folder {out}")
    return rep
