"""chunked-prefill-interference: bound the decode stall a prefill chunk causes (smaller
``--chunked-prefill-size``, ``--enable-mixed-chunk``). README.md."""

from __future__ import annotations

from perfscope.fixengine.flags import Decision, Flag, LaunchFlagFix, as_value
from perfscope.fixengine.launch import FlagChange

CHUNK = Flag("--chunked-prefill-size", "chunked_prefill_size", takes_value=True)
MIXED = Flag("--enable-mixed-chunk", "enable_mixed_chunk")
MIN_CHUNK = 512
TARGET_RATIO = 2.0  # a prefill chunk should stall decode by at most ~2 decode intervals


def pick_chunk(current: int, prefill_ms, interval_ms) -> tuple[int, str]:
    """The chunk size: scaled so one chunk takes ~TARGET_RATIO decode intervals (prefill time is
    ~linear in chunk tokens at these sizes), a power of two, at least MIN_CHUNK, at most half of now."""
    if prefill_ms and interval_ms and prefill_ms > 0:
        scaled = current * TARGET_RATIO * interval_ms / prefill_ms
        why = (
            f"a chunk of {current} tokens took {prefill_ms:.1f} ms against a {interval_ms:.1f} ms decode "
            f"interval: scaled to ~{TARGET_RATIO:g} intervals"
        )
    else:
        scaled = current / 2
        why = f"no prefill timing in the trace: half of {current}"
    p = MIN_CHUNK
    while p * 2 <= scaled:
        p *= 2
    return max(MIN_CHUNK, min(p, current // 2)), why


class ChunkedPrefillFix(LaunchFlagFix):
    id = "chunked-prefill-interference"
    title = "Bound the decode stall of prefill chunks (smaller --chunked-prefill-size, --enable-mixed-chunk)"
    answers = ("chunked-prefill-interference",)
    engines = ("sglang",)
    flags = {"sglang": (CHUNK, MIXED)}
    required_keys = ("chunked_prefill_size", "enable_mixed_chunk")
    requirements = {
        "flags": "SGLang whose /server_info reports chunked_prefill_size and enable_mixed_chunk; "
        "chunked prefill on (not -1) or set by this fix"
    }

    def decide(self, engine: str, current: dict, env) -> Decision:
        args = env.server_args or {}
        f = self.finding(env, "chunked-prefill-interference")
        ev = f.get("evidence") or {}
        cur = as_value(current.get("--chunked-prefill-size"))
        if cur is None:
            cur = as_value(args.get("chunked_prefill_size")) or as_value(ev.get("chunked_prefill_size"))
        changes: list = []
        whys: list = []
        if cur is None or cur <= 0:
            base = 8192
            new, why = pick_chunk(base, ev.get("prefill_median_ms"), ev.get("decode_interval_median_ms"))
            whys.append(
                f"chunked prefill is {'off' if cur is not None else 'at the default'}: "
                f"--chunked-prefill-size {new} (from SGLang's 8192 on large GPUs; {why})"
            )
            changes.append(FlagChange("set", "--chunked-prefill-size", str(new), why="bound each prefill chunk"))
        elif cur <= MIN_CHUNK:
            whys.append(f"--chunked-prefill-size {cur} is already at or below {MIN_CHUNK}")
        else:
            # the timing was measured at the trace's chunk size (its server config), else at today's
            base = as_value(ev.get("chunked_prefill_size")) or cur
            new, why = pick_chunk(base, ev.get("prefill_median_ms"), ev.get("decode_interval_median_ms"))
            if new < cur:
                changes.append(FlagChange("set", "--chunked-prefill-size", str(new), why="bound each prefill chunk"))
                whys.append(f"--chunked-prefill-size {cur} -> {new}: {why}")
        if not current.get("--enable-mixed-chunk") and args.get("enable_mixed_chunk") is not True:
            changes.append(FlagChange("add", "--enable-mixed-chunk", why="decode tokens ride along with each chunk"))
            whys.append("--enable-mixed-chunk: running requests decode inside each prefill chunk's forward")
        pred = f.get("predicted_step_ms_after_fix")
        worst = ev.get("decode_interval_max_ms")
        med = ev.get("decode_interval_median_ms")
        prediction = ""
        if pred is not None and worst and med:
            prediction = (
                f"decode step unchanged; the worst decode interval {worst:.1f} ms should fall towards "
                f"~{TARGET_RATIO + 1:g}x the {med:.1f} ms median"
            )
        return Decision(changes, why="; ".join(whys), predicted_step_ms=pred, prediction=prediction)


FIX = ChunkedPrefillFix()
