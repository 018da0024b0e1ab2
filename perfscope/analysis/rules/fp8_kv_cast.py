"""fp8-kv-cast: the whole FP8 KV pool cast to BF16 on every layer of every decode step."""

from __future__ import annotations

import math
import re
import statistics
from collections import defaultdict
from typing import Optional

from perfscope.analysis.buckets import classify
from perfscope.analysis.kernel_table import kernel_table
from perfscope.analysis.rules.base import Finding, Rule, RuleContext

_EPT = re.compile(r"elementwise_kernel(?:_manual_unroll)?<\d+, (\d+)")  # elementwise_kernel<NT, VT, ...>
# FlashInfer's MLA kernel reading the FP8 pool itself (the native strategy) instead of a BF16 copy,
# as measured on the H200 (FlashInfer 0.6.18, 60 layers, ~4k-token context, batch 1): its time per
# step / the BF16 kernel's. examples/gpu_loop/results/h200-2026-11-29 runs/bug vs runs/native:
# decode 2.311 / 1.618 ms, prefill (EXTEND, 4000 tokens) 121.1 / 64.0 ms. The same ratios held on
# the -pool250k and -overlap runs and (decode, 1.49) on the shared stepbench pair
# tests/traces/corpus/h200-mla-fp8-kv (tests/test_stepmodel.py checks them). A prefill step runs many
# query rows per KV row, so the in-kernel conversion costs it more than a decode step.
NATIVE_MLA_SLOWDOWN = {"decode": 1.43, "prefill": 1.89}
NATIVE_MLA_SOURCE = "H200, FlashInfer 0.6.18 (examples/gpu_loop/results/h200-2026-11-29)"
MLA_LATENT = 576  # kv_lora_rank 512 + qk_rope_head_dim 64 (DeepSeek V2/V3/R1, Kimi K2, GLM-4.5 MLA)
FP8_TYPES = ("Float8_e4m3fn", "Float8_e4m3fnuz", "Float8_e5m2", "Float8_e5m2fnuz")


def elements_per_thread(name: str) -> int:
    """Elements one thread of a torch elementwise copy kernel handles (unrolled: 4)."""
    m = _EPT.search(name)
    return int(m.group(1)) if m else 4


def is_cast_candidate(k) -> bool:
    """A torch dtype-converting copy kernel; in CPU-only traces, the leaf copy op (dtypes checked later)."""
    if k.kind == "kernel":
        return "direct_copy_kernel" in k.name and classify(k.name, k.kind)[1] == "cast"
    return k.kind == "cpu" and k.name in ("aten::copy_", "aten::_to_copy")


def latent_dim(config: dict) -> int:
    r, p = config.get("kv_lora_rank"), config.get("qk_rope_head_dim")
    if isinstance(r, int) and isinstance(p, int) and r + p > 0:
        return r + p
    return MLA_LATENT


class Fp8KvCast(Rule):
    id = "fp8-kv-cast"
    title = "Whole FP8 KV pool cast to BF16 on every layer"
    fix = "fp8-kv-cast"
    what = (
        "A dtype-converting copy kernel (torch `direct_copy_kernel_cuda` with `LoadWithCast`) runs "
        "once per layer per decode step over a tensor as large as the KV pool: SGLang's FlashInfer "
        "MLA (and fa3) backend calls `get_key_buffer(layer_id).to(q.dtype)` on the FP8 pool."
    )
    why = (
        "Each cast reads the whole pool (1 byte/element) and writes a BF16 copy (2 bytes/element), "
        "whatever the batch's context length: with a 495k-token pool of 576-byte latents that is "
        "~0.86 GB of traffic per layer, 60 times per step, at ~1 TB/s for this unvectorised kernel."
    )
    evidence = (
        "Eager traces: the CPU op chain `aten::to > aten::_to_copy > aten::copy_` with an FP8 "
        "input type and Input Dims [tokens, 1, 576]. Graph traces (no CPU ops): the kernel name "
        "and its grid x block x elements-per-thread, which give the elements cast; pool tokens = "
        "elements / 576. A cast torch splits into several launches (32-bit indexing: 16 per layer "
        "for a 15.7M-token pool) counts once: consecutive launches of the kernel on one stream are "
        "one cast. Checked against the server's max_total_num_tokens when known. Casts per step, "
        "ms per step and share of kernel time."
    )
    remedy = (
        "`perfscope fix fp8-kv-cast --apply`: on SM90 with FlashInfer >= 0.6.14, give FP8 to "
        "`plan()` and read the pool directly (native); elsewhere cast only the pages the batch reads."
    )
    false_positives = (
        "A model that really keeps a BF16 copy of a large FP8 tensor per layer for another "
        "reason; casts of activations are excluded by size (the cast must be repeated per "
        "step and cover >= 1M elements) and by share (>= 5% of kernel time)."
    )

    MIN_SHARE = 0.05
    MIN_ELEMENTS = 1 << 20

    @staticmethod
    def gathered_first(kernels, idx: list[int]) -> float:
        """Share of the casts whose previous kernel on the same stream is a gather/index kernel: the
        signature of casting only the referenced pages (the fix), not the pool."""
        hits = 0
        sample = idx[:120]
        for i in sample:
            k = kernels[i]
            j = i - 1
            while j >= 0 and i - j < 64 and kernels[j].stream != k.stream:
                j -= 1
            if j >= 0 and kernels[j].stream == k.stream and classify(kernels[j].name, kernels[j].kind)[1] == "gather":
                hits += 1
        return hits / len(sample) if sample else 0.0

    @staticmethod
    def launches_of_casts(ctx: RuleContext) -> dict:
        """Cast kernels of the steps grouped into casts: {signature: [[kernel index, ...], ...]}.

        torch splits a cast whose byte offsets overflow 32 bits into several launches of the same
        kernel, back to back on one stream (TensorIterator's 32-bit indexing): SGLang's default
        FP8 pool on one H200 (15.7M rows x 576) is cast in 16 launches per layer. Consecutive
        launches of one signature on one stream, with no other kernel of that stream between them
        (and the same input shapes where the trace records them), are one cast."""
        kern = ctx.trace.kernels
        table = kernel_table(ctx.trace)
        cand = [is_cast_candidate(kern[i]) for i in table.first]  # per distinct (name, kind)
        key = table.key
        casts: dict[tuple, list[list[int]]] = defaultdict(list)
        merge: dict = {}  # signature -> do its back-to-back launches belong to one cast?
        for s in ctx.steps:
            last: dict = {}  # stream -> (signature, run) of its last kernel if that was a cast, else None
            for i in sorted(s.kernels, key=lambda j: (kern[j].ts, j)):
                k = kern[i]
                if not cand[key[i]]:
                    last[k.stream] = None
                    continue
                sig = ctx.attributor.signature(k)
                prev = last.get(k.stream)
                if prev is not None and prev[0] == sig:
                    if sig not in merge:
                        # decided once per signature, at its first back-to-back pair: the same input
                        # shapes (or none recorded) = one op's launches (attribution walks the CPU
                        # ops, too slow to ask for every launch of a long trace)
                        a = ctx.attributor.attribute(kern[prev[1][0]]).input_dims
                        merge[sig] = a == ctx.attributor.attribute(k).input_dims
                    if merge[sig]:
                        prev[1].append(i)
                        continue
                run = [i]
                casts[sig].append(run)
                last[k.stream] = (sig, run)
        return casts

    def check(self, ctx: RuleContext) -> Optional[Finding]:
        if not ctx.steps or ctx.kernel_ms_per_step <= 0:
            return None
        kern = ctx.trace.kernels
        groups = self.launches_of_casts(ctx)
        if not groups:
            return None
        # the largest signature by time is the pool cast candidate
        _, runs = max(groups.items(), key=lambda kv: sum(kern[i].dur for r in kv[1] for i in r))
        idx = [i for r in runs for i in r]
        heads = [r[0] for r in runs]
        name = kern[idx[0]].name
        n = ctx.n_steps
        casts_per_step = len(runs) / n
        launches = sorted(len(r) for r in runs)
        launches_per_cast = launches[len(launches) // 2]
        ms_per_step = sum(kern[i].dur for i in idx) / n / 1e3
        share = ms_per_step / ctx.kernel_ms_per_step
        latent = latent_dim(ctx.config)
        # a cast of the usual launch count (the step's first and last may be cut by the trace window)
        full = next((r for r in runs if len(r) == launches_per_cast), runs[0])
        k0 = kern[full[0]]
        grid, block = k0.grid, k0.block
        attr = ctx.attributor.attribute(k0)
        src_type = dst_type = None
        dims = None
        if attr.input_types and attr.input_dims:
            types = [t for t in attr.input_types if isinstance(t, str)]
            # aten::copy_(self=dst, src): the FP8 tensor is the one with an FP8 dtype
            for t, d in zip(attr.input_types, attr.input_dims):
                if isinstance(t, str) and any(f in t for f in FP8_TYPES) and isinstance(d, list) and d:
                    src_type, dims = t, d
            dst = [t for t in types if src_type is None or t != src_type]
            dst_type = dst[0] if dst else None
        elements = None
        if dims and all(isinstance(x, int) for x in dims):
            elements = math.prod(dims)  # the whole tensor, however many launches cast it
            tokens = math.prod(dims[:-1])
            latent = dims[-1]
            source = "cpu-op shapes"
        elif all(kern[i].grid and kern[i].block for i in full):
            elements = sum(
                math.prod(kern[i].grid) * math.prod(kern[i].block) * elements_per_thread(kern[i].name) for i in full
            )
            tokens = elements // latent  # the grid rounds elements up to a whole block (per launch)
            source = "kernel launch geometry" + (f" ({len(full)} launches)" if len(full) > 1 else "")
        else:
            return None
        if casts_per_step < 2 or elements < self.MIN_ELEMENTS or share < self.MIN_SHARE:
            return None
        if (attr.input_types or k0.kind == "cpu") and src_type is None:
            return None  # the recorded dtypes say this is not an FP8 cast (or there are none to say it is)
        pool_cfg = ctx.config_value("max_total_num_tokens")
        pool_sized = isinstance(pool_cfg, int) and pool_cfg > 0 and tokens >= 0.5 * pool_cfg
        gathered = self.gathered_first(kern, heads)
        if gathered > 0.5 and not pool_sized:
            return None  # each cast reads a freshly gathered tensor: only the referenced pages

        kv_dtype = str(ctx.config_value("kv_cache_dtype", default="") or "")
        confidence = "high" if src_type else ("high" if "fp8" in kv_dtype else "medium")
        bytes_per_cast = elements * 3  # read 1 B (fp8) + write 2 B (bf16)
        avg_us = sum(kern[i].dur for i in idx) / len(runs)  # per cast, all its launches
        evidence = {
            "pool_tokens": int(tokens),
            "casts_per_step": round(casts_per_step, 2),
            "launches_per_cast": launches_per_cast,
            "elements_per_cast": int(elements),
            "latent_dim": int(latent),
            "bytes_per_cast": int(bytes_per_cast),
            "avg_cast_us": round(avg_us, 2),
            "achieved_gb_s": round(bytes_per_cast / (avg_us * 1e3), 1) if avg_us > 0 else None,
            "sized_from": source,
            "kernel": name,
            "grid": list(grid) if grid else None,
            "block": list(block) if block else None,
            "src_dtype": src_type,
            "dst_dtype": dst_type or ("BFloat16" if "BFloat16" in name else None),
            "input_dims": dims,
            "op_chain": attr.op_chain or None,
            "source": attr.source,
            "graph_replay": attr.graph_replay,
            "preceded_by_gather": round(gathered, 3),
            "kv_cache_dtype": kv_dtype or None,
            "max_total_num_tokens": pool_cfg,
        }
        note = ""
        if isinstance(pool_cfg, int) and pool_cfg > 0:
            evidence["pool_fraction_cast"] = round(tokens / pool_cfg, 3)
            # SGLang's pool holds max_total_num_tokens + page_size rows; a launch grid rounds up by < 1 row
            evidence["pool_matches_config"] = abs(tokens - pool_cfg) <= max(64, pool_cfg // 1000)
            if not evidence["pool_matches_config"]:
                note = f" (the server reports a {pool_cfg:,}-token pool)"
        # Fixed: the casts disappear (native) or shrink to the pages the batch reads (pages). Each step
        # is paired with its own casts: the mean cast time can exceed the median step (one slow step).
        removed = frozenset(idx)  # fixed natively, the casts are gone (the step model replays the rest)
        per_step = [(s.gpu_us, sum(kern[i].dur for i in s.kernels if i in removed)) for s in ctx.steps]
        predicted = statistics.median(max(g - c, 0.0) for g, c in per_step) / 1e3
        cast_ms = statistics.median(c for _, c in per_step) / 1e3  # <= the median step: each cast <= its step
        where = f" at {attr.source}" if attr.source else ""
        split = f", each in {launches_per_cast} launches (torch's 32-bit indexing)" if launches_per_cast > 1 else ""
        said = (
            f"{casts_per_step:.0f} casts per step convert a {tokens:,}-token FP8 KV pool to BF16"
            f"{note}{where}{split}: {cast_ms:.1f} ms of a {ctx.step_ms:.1f} ms step ({share:.0%} of kernel time); "
        )

        def summary_at(step_ms: float) -> str:
            return said + f"fixed, the step should take ~{step_ms:.1f} ms (every other kernel as it is)."

        assumes = (
            "the casts go and every other kernel keeps its time: what the pages strategy does "
            "(BF16 attention on the rows the batch reads, plus their small conversion)"
        )
        alternatives = {}
        table = kernel_table(ctx.trace)
        is_mla = [("BatchMLAPagedAttentionKernel" in kern[i].name) for i in table.first]  # per distinct name
        key = table.key
        mla = frozenset(i for s in ctx.steps for i in s.kernels if is_mla[key[i]] and i not in removed)
        cc = str(ctx.trace.meta.compute_capability or "")
        if mla and cc.startswith("9."):
            # SM90: the fix's default is native, and FlashInfer's MLA kernel then reads FP8 itself, slower
            phase = "prefill" if ctx.phase in ("prefill", "mixed") else "decode"
            x = NATIVE_MLA_SLOWDOWN[phase]
            mla_ms = sum(kern[i].dur for i in mla) / n / 1e3
            alternatives["native"] = (
                lambda i, x=x: 0.0 if i in removed else (kern[i].dur * x if i in mla else None),
                0.0,
                f"With the native strategy (the fix's default on SM90), FlashInfer's MLA kernel reads FP8 "
                f"itself: {x:.2f}x its BF16 time on a {phase} step as measured on {NATIVE_MLA_SOURCE}, "
                f"+{mla_ms * (x - 1):.1f} ms of attention",
            )
            evidence["native_mla_slowdown"] = {
                "phase": phase,
                "factor": x,
                "attention_ms_per_step": round(mla_ms, 4),
                "source": NATIVE_MLA_SOURCE,
            }
        return self.finding(
            summary_at=summary_at,
            ms_per_step=ms_per_step,
            share=share,
            confidence=confidence,
            predicted_step_ms_after_fix=predicted,
            evidence=evidence,
            new_duration=lambda i: 0.0 if i in removed else None,
            assumes=assumes,
            alternatives=alternatives,
        )
