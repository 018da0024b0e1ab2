"""nccl-allreduce: SGLang's custom all-reduce back on (drop ``--disable-custom-all-reduce``). README.md."""

from __future__ import annotations

from perfscope.fixengine.flags import Decision, Flag, LaunchFlagFix, as_value, is_amd_gpu
from perfscope.fixengine.launch import FlagChange

DISABLE = Flag("--disable-custom-all-reduce", "disable_custom_all_reduce")
REPRO = Flag("--allreduce", None, takes_value=True)


class NcclAllReduceFix(LaunchFlagFix):
    id = "nccl-allreduce"
    title = "Use the custom all-reduce for decode (drop --disable-custom-all-reduce)"
    answers = ("nccl-allreduce",)
    engines = ("sglang", "vllm", "repro")
    flags = {"sglang": (DISABLE,), "vllm": (DISABLE,), "repro": (REPRO,)}
    assumed = {"--disable-custom-all-reduce": True}
    required_keys = ("disable_custom_all_reduce", "tp_size")
    requirements = {
        "flags": "tensor parallelism (tp_size > 1) on NVIDIA GPUs of one node (the custom all-reduce "
        "uses CUDA IPC over NVLink; SGLang falls back to NCCL by itself where it cannot)"
    }

    def decide(self, engine: str, current: dict, env) -> Decision:
        args = env.server_args or {}
        tp = as_value(args.get("tp_size"))
        if tp == 1:
            return Decision([], skipped="tp_size 1: a single GPU does no all-reduce")
        nnodes = as_value(args.get("nnodes"))
        if nnodes and nnodes > 1:
            return Decision(
                [],
                refused=f"nnodes {nnodes}: the custom all-reduce works within one node; across "
                "nodes NCCL is the right choice; nothing changed",
            )
        if is_amd_gpu(env.gpu_name):
            return Decision([], refused=f"{env.gpu_name}: this fix knows NVIDIA's custom all-reduce; nothing changed")
        f = self.finding(env, "nccl-allreduce")
        pred = f.get("predicted_step_ms_after_fix")
        how = "the exposed NCCL all-reduce time cut by 60% (one-shot custom all-reduce)" if pred is not None else ""
        if engine == "repro":
            if current.get("--allreduce") == "custom":
                return Decision([], why="--allreduce custom is set")
            return Decision(
                [FlagChange("set", "--allreduce", "custom", why="the repro server's custom all-reduce")],
                why="the reproduction server's one-shot all-reduce",
                predicted_step_ms=pred,
                prediction=how,
            )
        if not current.get("--disable-custom-all-reduce"):
            return Decision(
                [],
                why="--disable-custom-all-reduce is not on the launch command: if NCCL still runs, "
                "the server chose it (PCIe-only GPUs, message above its limit): see its log",
            )
        return Decision(
            [
                FlagChange(
                    "remove",
                    "--disable-custom-all-reduce",
                    why="decode-size all-reduces finish faster in the custom kernel",
                )
            ],
            why="the custom all-reduce serves decode-size messages (batch x hidden) in a fraction of "
            "NCCL's latency, and runs under CUDA graphs",
            predicted_step_ms=pred,
            prediction=how,
        )


FIX = NcclAllReduceFix()
