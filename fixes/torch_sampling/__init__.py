"""torch-sampling: FlashInfer's fused sampling kernels (``--sampling-backend flashinfer``). README.md."""

from __future__ import annotations

from perfscope.fixengine.flags import Decision, Flag, LaunchFlagFix, is_amd_gpu
from perfscope.fixengine.launch import FlagChange

BACKEND = Flag("--sampling-backend", "sampling_backend", takes_value=True)


class TorchSamplingFix(LaunchFlagFix):
    id = "torch-sampling"
    title = "Sample with FlashInfer's fused kernels (--sampling-backend flashinfer)"
    answers = ("torch-sampling",)
    engines = ("sglang",)
    flags = {"sglang": (BACKEND,)}
    assumed = {"--sampling-backend": "pytorch"}
    required_keys = ("sampling_backend",)
    requirements = {
        "flags": "an NVIDIA GPU (CUDA device) with FlashInfer installed (SGLang's default on CUDA); "
        "SGLang whose /server_info reports sampling_backend"
    }

    def decide(self, engine: str, current: dict, env) -> Decision:
        args = env.server_args or {}
        dev = str(args.get("device") or "")
        if dev and not dev.startswith("cuda"):
            return Decision(
                [], refused=f"the server runs on {dev}: FlashInfer's sampling kernels need a CUDA GPU; nothing changed"
            )
        if is_amd_gpu(env.gpu_name):
            return Decision(
                [], refused=f"{env.gpu_name}: FlashInfer's sampling kernels are CUDA kernels; nothing changed"
            )
        f = self.finding(env, "torch-sampling")
        pred = f.get("predicted_step_ms_after_fix")
        cur = current.get("--sampling-backend")
        served = args.get("sampling_backend")
        if cur == "flashinfer" or (cur is None and served == "flashinfer"):
            return Decision([], why="the sampling backend is already flashinfer")
        was = cur or (f"{served} (the server's choice)" if served else "the server's default")
        return Decision(
            [
                FlagChange(
                    "set", "--sampling-backend", "flashinfer", why="fused top-k/top-p sampling, no sort of the logits"
                )
            ],
            why=f"sampling backend {was} sorts [batch, vocab] logits every token; FlashInfer's "
            "rejection sampling needs no sort",
            predicted_step_ms=pred,
            prediction="the step minus 80% of the sampling kernels' time" if pred is not None else "",
        )


FIX = TorchSamplingFix()
