"""untuned-fused-moe: SGLang's Triton fused-MoE kernel runs a large share of decode, on its default config."""

from __future__ import annotations

import re
from typing import Optional

from perfscope.analysis.moe_config import config_file_name, moe_shape, scan_log, version_dir
from perfscope.analysis.rules.base import Finding, Rule, RuleContext

_BS = re.compile(r"\bbs=(\d{1,5})\b")
_FUSED_MOE = re.compile(r"fused_moe_kernel")
TUNED_SPEEDUP = 1.3  # measured gains of tuned over default configs on decode shapes are ~1.2-2x


class UntunedFusedMoe(Rule):
    id = "untuned-fused-moe"
    title = "Triton fused MoE kernel on its default config"
    fix = "untuned-fused-moe"
    what = (
        "The Triton `fused_moe_kernel` takes a large share of each decode step. SGLang loads a tuned block-size "
        "config per (experts E, intermediate size N per rank, dtype, GPU name, Triton version) from "
        "`configs/triton_<version>/E=..,N=..,device_name=...json`; without one it logs 'Using default MoE kernel "
        "config' and runs a generic tiling."
    )
    why = (
        "Decode MoE GEMMs are tiny per expert; the default tile sizes waste most of each tile and the "
        "kernel runs well below memory bandwidth."
    )
    evidence = (
        "fused_moe_kernel ms and calls per step and its share of kernel time; with the model's config and the "
        "batch: its achieved TFLOP/s against the GPU's peak; the config file SGLang looks for; with the server "
        "log (`diagnose --server-log`) SGLang's own line saying it was not found. What could not be "
        "checked on a trace alone is listed."
    )
    remedy = (
        "`perfscope fix untuned-fused-moe` (checks the server's install for the file, then tunes SGLang's own "
        "kernel for the served batch sizes and installs the file where SGLang reads it); or SGLang's "
        "`benchmark/kernels/fused_moe_triton/tuning_fused_moe_triton.py`; or a backend with its own MoE kernels "
        "(`--moe-runner-backend` flashinfer/cutlass where supported)."
    )
    false_positives = (
        "A model whose MoE really is most of the work with a tuned config already installed: the trace "
        "cannot show which config ran; the log line, or the fix's check of the install, decides."
    )

    MIN_SHARE = 0.10

    def check(self, ctx: RuleContext) -> Optional[Finding]:
        if not ctx.steps or ctx.kernel_ms_per_step <= 0:
            return None
        ms, calls = ctx.time_of(lambda k: _FUSED_MOE.search(k.name) is not None)
        share = ms / ctx.kernel_ms_per_step
        if share < self.MIN_SHARE:
            return None
        ev: dict = {
            "fused_moe_ms_per_step": round(ms, 4),
            "fused_moe_calls_per_step": round(calls, 2),
            "share_of_moe": (round(ms / ctx.buckets_ms["moe"], 4) if ctx.buckets_ms.get("moe") else None),
            "assumed_tuned_speedup": TUNED_SPEEDUP,
            "device": ctx.trace.meta.device_name,
            "ep_size": ctx.config_value("ep_size"),
            "tp_size": ctx.config_value("tp_size"),
        }
        batches = sorted(
            {int(m.group(1)) for st in ctx.steps if st.phase == "decode" for m in [_BS.search(st.label or "")] if m}
        )
        if batches:
            ev["decode_batches"] = batches[:16]  # SGLang's step[DECODE bs=N]: the sizes a tuner must cover
        unchecked: list[str] = []
        name = self._file_and_flops(ctx, ms, ev, unchecked)
        log = ctx.config.get("server_log")
        lines = scan_log(log) if isinstance(log, str) else []
        mine = [x for x in lines if not name or x.path.endswith("/" + name)]
        confidence = "medium"
        saw = ""
        if mine:
            ev["server_log"] = [{"kind": x.kind, "path": x.path, "used": x.used} for x in mine]
            if all(x.kind == "exact" for x in mine):
                return None  # SGLang says it loaded a tuned config for this shape
            confidence = "high"
            saw = (
                " The server log says it ran its default config."
                if any(x.kind == "default" for x in mine)
                else " The server log says it loaded another Triton version's config."
            )
        elif lines:
            unchecked.append(f"the server log: it has SGLang MoE config lines, none for {name}")
        else:
            unchecked.append("the server log ('Using default MoE kernel config' line): give --server-log")
        unchecked.append("the server's install (configs folder): `perfscope fix untuned-fused-moe` checks it")
        ev["could_not_check"] = unchecked
        missing = f" SGLang looks for {name}." if name else ""
        summary = (
            f"The Triton fused MoE kernel takes {ms:.2f} ms per step ({share:.0%} of kernel time, "
            f"{calls:.0f} calls).{saw}{missing} Tune it for the served batch sizes."
        )
        saved = ms * (1 - 1 / TUNED_SPEEDUP)
        fused_moe = ctx.by_name(lambda k: _FUSED_MOE.search(k.name) is not None)
        kern = ctx.trace.kernels
        return self.finding(
            summary=summary,
            ms_per_step=ms,
            share=share,
            confidence=confidence,
            predicted_step_ms_after_fix=round(max(ctx.step_ms - saved, 0.0), 4),
            new_duration=lambda i: kern[i].dur / TUNED_SPEEDUP if fused_moe(i) else None,
            evidence=ev,
        )

    @staticmethod
    def _file_and_flops(ctx: RuleContext, ms: float, ev: dict, unchecked: list[str]) -> Optional[str]:
        """The config file name SGLang wants (None when the model's shape is unknown); achieved TFLOP/s."""
        mc = ctx.config.get("model_config")
        tp = ctx.config_value("tp_size", default=1) or 1
        ep = ctx.config_value("ep_size", default=1) or 1
        shape = moe_shape(mc, int(tp), int(ep)) if isinstance(mc, dict) else None
        if shape is None:
            unchecked.append("the model's MoE shape (E, N, top-k): give --model-config")
            return None
        ev["moe_shape"] = {
            "E": shape.experts,
            "N": shape.intermediate,
            "top_k": shape.top_k,
            "hidden": shape.hidden,
            "moe_layers": shape.moe_layers,
        }
        dev = ctx.trace.meta.device_name
        name = config_file_name(shape.experts, shape.intermediate, dev) if dev else None
        if name:
            ev["config_file"] = name
            tv = ctx.config.get("triton_version")
            if isinstance(tv, str) and tv:
                ev["config_path"] = f"configs/{version_dir(tv)}/{name}"
            else:
                unchecked.append("the server's Triton version (the configs/triton_<version>/ folder)")
        else:
            unchecked.append("the GPU's name (not in the trace)")
        from perfscope.analysis.floor import floor_inputs

        bs = floor_inputs(ctx.trace.meta.to_dict(), ctx.config, [s.label for s in ctx.steps]).get("batch")
        if bs and ms > 0:
            flops = shape.flops_per_token() * bs * shape.moe_layers
            ev["batch"] = bs
            ev["achieved_tflops"] = round(flops / (ms * 1e9), 3)
            from perfscope.analysis.gpus import match_gpu

            g = match_gpu(dev).gpu
            if g is not None:
                peak = g.peak_tflops("bf16")
                ev["peak_tflops"] = peak
                ev["achieved_over_peak"] = round(flops / (ms * 1e9) / peak, 4) if peak else None
        else:
            unchecked.append("the decode batch size (give --batch): achieved TFLOP/s not computed")
        return name
