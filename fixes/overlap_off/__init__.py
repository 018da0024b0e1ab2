"""overlap-off: SGLang's overlap scheduler back on (drop ``--disable-overlap-schedule``). README.md."""

from __future__ import annotations

from perfscope.fixengine.flags import Decision, Flag, LaunchFlagFix, as_value
from perfscope.fixengine.launch import FlagChange

DISABLE = Flag("--disable-overlap-schedule", "disable_overlap_schedule")


class OverlapOffFix(LaunchFlagFix):
    id = "overlap-off"
    title = "Turn SGLang's overlap scheduler back on (drop --disable-overlap-schedule)"
    answers = ("overlap-off", "host-bubble")
    engines = ("sglang", "repro")
    flags = {"sglang": (DISABLE,), "repro": (DISABLE,)}
    assumed = {"--disable-overlap-schedule": True}
    required_keys = ("disable_overlap_schedule",)
    requirements = {
        "flags": "SGLang whose /server_info reports disable_overlap_schedule; no pipeline "
        "parallelism (pp_size 1), where SGLang turns the overlap off itself"
    }

    def decide(self, engine: str, current: dict, env) -> Decision:
        args = env.server_args or {}
        pp = as_value(args.get("pp_size"))
        if pp and pp > 1:
            return Decision(
                [],
                refused=f"pp_size {pp}: SGLang runs pipeline parallelism without the overlap "
                "scheduler whatever the flag; nothing changed",
            )
        f = self.finding(env, "overlap-off") or self.finding(env, "host-bubble")
        pred = f.get("predicted_step_ms_after_fix")
        ev = f.get("evidence") or {}
        gap = ev.get("gap_between_steps_ms")
        if f.get("id") == "overlap-off" and isinstance(f.get("ms_per_step"), (int, float)):
            gap = f["ms_per_step"]  # the idle the host's serial work leaves, without the profiler
        if not current.get("--disable-overlap-schedule"):
            why = "--disable-overlap-schedule is not on the launch command"
            if args.get("disable_overlap_schedule") is True:
                why += (
                    " but /server_info reports disable_overlap_schedule=true: the server turned it off "
                    "itself (speculative decoding, an option that needs the normal loop...): see its log"
                )
            return Decision([], why=why)
        return Decision(
            [FlagChange("remove", "--disable-overlap-schedule", why="the overlap scheduler is SGLang's default")],
            why="the next batch is scheduled while the current forward runs"
            + (f", hiding the {gap:.2f} ms per step the GPU idles waiting for the host" if gap else ""),
            predicted_step_ms=pred,
            prediction=(_range(ev) or "the larger of the step's GPU work and the host's serial work")
            if pred is not None
            else "",
        )


def _range(ev: dict) -> str:
    r = (ev.get("prediction") or {}).get("range_ms")
    if isinstance(r, list) and len(r) == 2 and all(isinstance(x, (int, float)) for x in r):
        return f"the larger of the step's GPU work and the host's serial work; expect {r[0]:.2f}-{r[1]:.2f} ms"
    return ""


FIX = OverlapOffFix()
