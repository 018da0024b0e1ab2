"""How ``fix --apply --restart-cmd`` measures a server and decides on what it measured (the sequence:
:mod:`perfscope.fixengine.restart`): rounds of requests until enough is known (:func:`measure`), the
keep-or-revert decision on the change of the TPOT median and its bootstrap interval (:func:`decide`,
:mod:`perfscope.analysis.change`), and, after a revert as slower, whether the patch or the host was slower
(:func:`blame`, A-B-A)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

from perfscope.fixengine.host import FixHost
from perfscope.fixengine.options import BenchSpec


def measure(client, info: dict, spec: BenchSpec, host: Optional[FixHost] = None, enough=None):
    """The server measured in rounds of ``spec.num_requests`` until ``enough(tpots)`` (at most
    ``spec.max_requests``), with prompt ids inside the model's vocabulary."""
    from perfscope.bench.core import measure_until
    from perfscope.bench.vocab import is_loopback_url, token_ids

    # prompt ids inside the model's vocabulary: its config.json, read where the server runs
    io = getattr(host, "io", None) if host is not None and (host.remote or is_loopback_url(client.base_url)) else None
    ids, _ = token_ids(info, io)
    return measure_until(
        client,
        enough,
        input_len=spec.input_len,
        output_len=spec.output_len,
        concurrency=spec.concurrency,
        num_requests=spec.num_requests,
        max_requests=max(spec.max_requests, spec.num_requests),
        warmup=spec.warmup,
        server_info=info,
        ids=ids,
    )


def before_known(tpots: list[float]) -> bool:
    """BEFORE's median is known well enough to decide against: to +-NOISE."""
    from perfscope.analysis.change import NOISE, median_interval

    iv = median_interval(tpots)
    return iv is not None and max(-iv[0], iv[1]) <= NOISE


def decide(before: list[float], after: list[float], max_slowdown: float) -> tuple[Optional[str], dict]:
    """("revert" | "keep" | None: undecided, the change with its interval). Revert only when the
    whole interval of the TPOT median's change lies above ``max_slowdown``; keep only when it
    lies wholly at or below it."""
    from perfscope.analysis.change import median_change

    c = median_change(before, after)
    if not c.get("interval"):
        return None, c
    lo, hi = c["interval"]
    if lo > max_slowdown:
        return "revert", c
    if hi <= max_slowdown:
        return "keep", c
    return None, c


def bar(max_slowdown: float, gain: float = 0.0) -> float:
    """The change of the TPOT median a fix is decided against: ``-gain`` for a fix kept only when it is
    faster by more than ``gain`` (its ``keep_only_if_faster``), else ``max_slowdown``."""
    return -gain if gain else max_slowdown


def after_decided(before: list[float], max_slowdown: float, gain: float = 0.0) -> Callable[[list[float]], bool]:
    """The stop test of the rounds after the patch: whether :func:`keep_or_revert` has a decision
    against the same bar (more rounds cannot change it), so a fix held to a gain is measured until
    that gain is shown or ruled out, not until --max-slowdown is."""
    b = bar(max_slowdown, gain)
    return lambda after: decide(before, after, b)[0] is not None


def keep_or_revert(
    before: list[float], after: list[float], max_slowdown: float, gain: float = 0.0
) -> tuple[Optional[str], dict]:
    """``decide`` against what the fix holds itself to (:func:`bar`): a fix kept only when it is faster
    by more than ``gain`` (a fraction; its ``keep_only_if_faster``) is reverted unless that gain is
    shown, an undecided change included (the gain is what it promised, and the noise did not show it);
    any other fix against ``max_slowdown``, where an undecided change stays undecided (it is neither
    kept nor reverted on that evidence)."""
    decision, c = decide(before, after, bar(max_slowdown, gain))
    if gain and decision is None:
        return "revert", c
    return decision, c


def blame(after: list[float], again: list[float], max_slowdown: float) -> tuple[Optional[str], dict]:
    """Who made it slower, once a patch was reverted as slower: the original server measured again
    after the revert (``again``; an A-B-A design) against the patched one (``after``). "patch" when
    the patched TPOT median lies surely more than ``max_slowdown`` above the original's again; "host"
    when the original measures as slow now (the change lies wholly at or below ``max_slowdown``):
    the host's background load or drift moved both, not the patch; None: undecided. Returns the
    verdict and the change from AFTER to AGAIN's side (``decide(again, after)``)."""
    verdict, c = decide(again, after, max_slowdown)
    return {"revert": "patch", "keep": "host"}.get(verdict or ""), c


def samples(res) -> list[float]:
    return [r["tpot_ms"] for r in res.per_request if r.get("ok") and r.get("tpot_ms") is not None]


def store(folder: Path, res, url: str, host: FixHost, info: dict, argv: list[str]) -> dict:
    """``folder/bench.json`` + ``run.json``, as ``perfscope bench --out`` writes them; returns the summary."""
    from perfscope.bench.store import store as store_bench

    store_bench(folder, res, url, host.label if host.remote else None, info, argv)
    return res.to_dict(per_request=False)


def tpot(summary: Optional[dict]) -> Optional[float]:
    v = (summary or {}).get("tpot_ms")
    return float(v) if isinstance(v, (int, float)) else None
