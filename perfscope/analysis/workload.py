"""What a trace is: LLM inference (serving), training, or other (non-LLM) inference.

perfscope's rules are about LLM serving (decode steps, server flags). A `ProfilerStep` trace of a
training loop or of a CNN is not a decode loop: its steps are training iterations, its NCCL
all-reduces are gradient syncs, and "turn on CUDA graphs in SGLang" is no advice for it. So the
trace kind is read first, from what each kind must contain:

- training: autograd's backward ops (`autograd::engine::evaluate_function: ...`, `*Backward0`), the
  optimizer (`Optimizer.step#...`, `Optimizer.zero_grad#...`); without CPU ops, backward kernels
  (`*backward*`, `*_bwd*`, cuDNN `dgrad`/`wgrad`) as a real share of kernel time;
- non-LLM inference: no backward, and a diffusion pipeline (xDiT / diffusers: a `*diffusion*` or
  `*denois*` annotation, Python frames of `diffusers/`, `xfuser/`, a `scheduling_*.py` scheduler or a
  UNet / `*Transformer2DModel` / `AutoencoderKL` module), or convolutions a large share of kernel time
  (CNNs, VAEs); its steps are pipeline runs, not decode steps (phase `inference`);
- model forwards run by Hugging Face transformers outside a serving engine: Python frames of
  `transformers/models/<arch>/modeling_*.py` or `transformers/pipelines/`, none of vLLM or SGLang, no
  serving-engine step annotation and no `generate` loop (`transformers/generation/`): each profiled
  step is one forward pass (a classifier, an encoder, a detector, or one LLM forward), not a decode
  step, and there is no KV cache or sampler to read kernels as (phase `inference`, model
  `transformers`); the launch-bound check of eager-decode still applies to it, the server fixes do not;
- LLM inference otherwise (serving-engine step annotations, KV-cache writes, sampling and decode
  attention kernels say so with more confidence).
"""

from __future__ import annotations

import itertools
import operator
import re
from itertools import compress, repeat
from typing import Iterable

from perfscope.analysis.kernel_table import kernel_table
from perfscope.util.fold import added
from perfscope.load.model import Annotation, CpuOp, KERNEL_DUR, KERNEL_KIND, Trace

_BACKWARD_OP = re.compile(r"^autograd::engine::evaluate_function|Backward\d*$")
_OPTIMIZER = "Optimizer.step#"  # a range name's start, one per iteration (zero_grad is another range of the same one)
_BACKWARD_KERNEL = re.compile(r"backward|_bwd|dgrad|wgrad", re.I)
_DIFFUSION_ANN = re.compile(r"diffusion|denois", re.I)
_DIFFUSION_FRAME = re.compile(
    r"(^|/)(diffusers|xfuser)/|(^|/)scheduling_\w+\.py\(|"
    r"^nn\.Module: \w*(UNet\w*|Transformer2DModel|AutoencoderKL\w*)_\d+$"
)
_HF_MODEL_FRAME = re.compile(r"(^|/)transformers/(models/(\w+)/modeling_\w+\.py|pipelines/)")
_HF_GENERATE_FRAME = re.compile(r"(^|/)transformers/generation/")
_ENGINE_FRAME = re.compile(r"(^|/)(vllm|sglang)/")
_SERVING_STEP = re.compile(r"^step\[(DECODE|EXTEND|MIXED|PREFILL|IDLE|TARGET_VERIFY|DRAFT_EXTEND)|^execute_\w*context")


BACKWARD_OPS_MIN = 3
BACKWARD_KERNEL_SHARE = 0.10
CONV_SHARE = 0.20


def classify_workload(trace: Trace) -> dict:
    """{kind: "llm-inference" | "training" | "inference", serving_rules: bool, evidence: {...}, how: str,
    model: "diffusion" | "cnn" (non-LLM inference only)}.

    ``serving_rules``: whether perfscope's rules (all about LLM serving) run on the trace."""
    op_names: dict = {}  # distinct op name -> how many ops: each name's regexes searched once
    for o in trace.cpu_ops:
        op_names[o.name] = op_names.get(o.name, 0) + 1
    bw_ops = sum(n for name, n in op_names.items() if _BACKWARD_OP.search(name))
    optim = len(optimizer_steps(trace))
    serving = sum(1 for a in trace.annotations if _SERVING_STEP.match(a.name))
    kern = trace.kernels  # the durations and kinds read in C
    total = sum(compress(map(KERNEL_DUR, kern), map(operator.eq, map(KERNEL_KIND, kern), repeat("kernel")))) or 0.0
    bw_us = conv_us = llm_us = 0.0
    table = kernel_table(trace)
    # per distinct (name, kind): (a backward kernel, a convolution, LLM evidence), or None when none or
    # not a kernel; (torch's generic sort / top-k kernels are not evidence of an LLM: MoE routing and
    # other top-k run them)
    flags: list = []
    for i in table.first:
        k = kern[i]
        b, sub = table.pair[i]
        f = (
            _BACKWARD_KERNEL.search(k.name) is not None,
            sub == "conv",
            sub == "kv-write" or (b == "sampling" and not table.torch_sort[i]) or "flashinfer::" in k.name,
        )
        flags.append(f if k.kind == "kernel" and any(f) else None)
    # each flag's kernel time: the durations of the kernels whose (name, kind) has it, added in kernel order
    # (in C; none when no name has it)
    us = []
    for n in range(3):
        keys = {key for key, f in enumerate(flags) if f is not None and f[n]}
        us.append(added(compress(map(KERNEL_DUR, kern), map(keys.__contains__, table.key))) if keys else 0.0)
    bw_us, conv_us, llm_us = us
    diff_ann = sorted({a.name for a in trace.annotations if _DIFFUSION_ANN.search(a.name)})
    frame_names = {f.name for f in trace.frames}
    diff_frames = sorted(n for n in frame_names if _DIFFUSION_FRAME.search(n))
    ev = {
        "backward_ops": bw_ops,
        "optimizer_steps": optim,
        "serving_step_annotations": serving,
        "backward_kernel_share": round(bw_us / total, 4) if total else 0.0,
        "conv_kernel_share": round(conv_us / total, 4) if total else 0.0,
        "diffusion_annotations": len(diff_ann),
        "diffusion_frames": len(diff_frames),
    }
    if serving == 0 and (bw_ops >= BACKWARD_OPS_MIN or optim > 0 or (total and bw_us / total >= BACKWARD_KERNEL_SHARE)):
        what = []
        if bw_ops:
            what.append(f"{bw_ops} autograd backward ops")
        if optim:
            what.append(f"{optim} optimizer steps")
        if total and bw_us / total >= BACKWARD_KERNEL_SHARE:
            what.append(f"backward kernels {bw_us / total:.0%} of kernel time")
        return {
            "kind": "training",
            "serving_rules": False,
            "evidence": ev,
            "how": "a training trace (" + ", ".join(what) + "): its steps are training iterations, "
            "not decode steps; perfscope's serving rules do not apply",
        }
    if serving == 0 and (diff_ann or diff_frames):
        what = []
        if diff_ann:
            what.append("annotation " + ", ".join(f"`{n[:60]}`" for n in diff_ann[:2]))
        if diff_frames:
            libs = sorted({m.group(2) for m in (re.search(r"(^|/)(diffusers|xfuser)/", n) for n in diff_frames) if m})
            mods = sorted({n.split(": ", 1)[1].rsplit("_", 1)[0] for n in diff_frames if n.startswith("nn.Module: ")})
            what.append(
                f"{len(diff_frames)} Python functions of "
                + (", ".join(libs) or "a diffusion pipeline")
                + (f" (modules {', '.join(mods[:3])})" if mods else "")
            )
        return {
            "kind": "inference",
            "model": "diffusion",
            "serving_rules": False,
            "evidence": ev,
            "how": "diffusion-model inference (" + "; ".join(what) + "), not an LLM: its steps are "
            "denoising pipeline runs, not decode steps, and there is no KV cache or sampling; "
            "perfscope's serving rules do not apply",
        }
    hf = hf_forwards(frame_names) if serving == 0 else None
    if hf is not None:
        ev["transformers_models"] = hf
        return {
            "kind": "inference",
            "model": "transformers",
            "serving_rules": False,
            "evidence": ev,
            "how": "Hugging Face transformers model forwards ("
            + (", ".join(hf[:4]) or "a pipeline")
            + ") outside a serving engine: each profiled step is one forward pass, not a decode step, "
            "with no KV cache or sampler; perfscope's serving rules do not apply (the launch-bound check "
            "of eager-decode does)",
        }
    if serving == 0 and total and conv_us / total >= CONV_SHARE and not llm_us:
        return {
            "kind": "inference",
            "model": "cnn",
            "serving_rules": False,
            "evidence": ev,
            "how": f"non-LLM inference (convolutions {conv_us / total:.0%} of kernel time, no KV cache or "
            "sampling kernels): perfscope's serving rules do not apply",
        }
    if serving or llm_us:
        how = "LLM inference: " + (
            "serving-engine step annotations" if serving else "KV-cache / sampling / FlashInfer kernels"
        )
        return {"kind": "llm-inference", "serving_rules": True, "evidence": ev, "how": how}
    return {
        "kind": "inference",
        "serving_rules": True,
        "evidence": ev,
        "how": "inference with no serving-engine annotations, KV-cache writes or sampling kernels (analysed as "
        "LLM decode; the findings may not apply if this is not an LLM)",
    }


def optimizer_steps(trace: Trace) -> list[tuple]:
    """The (thread, start, end) of the ``Optimizer.step#...`` ranges, one per training iteration. A range
    is recorded as a CPU annotation, often again as a GPU-side one or a CPU op of the same name; a loop
    may step two optimizers per iteration (Shampoo, then an EMA): the iterations are the ranges of the
    optimizer stepped most often, each once (zero_grad, another range of the same iteration, not at all)."""
    by: dict[str, set[tuple]] = {}
    ranges: Iterable[CpuOp | Annotation] = itertools.chain(trace.cpu_ops, [a for a in trace.annotations if not a.gpu])
    for x in ranges:
        if x.name.startswith(_OPTIMIZER):
            by.setdefault(x.name, set()).add((x.tid, x.ts, x.ts + x.dur))
    if not by:
        return []
    most_stepped: set[tuple] = max(by.values(), key=len)
    return sorted(most_stepped, key=lambda r: r[1])


def hf_forwards(frame_names) -> "list[str] | None":
    """The model architectures (``vit``, ``bert``...) of a trace of Hugging Face model forwards outside a
    serving engine and outside a ``generate`` loop, from its Python frames' names; None if it is not one."""
    archs: set[str] = set()
    found = False
    for n in frame_names:
        if _ENGINE_FRAME.search(n) or _HF_GENERATE_FRAME.search(n):
            return None
        m = _HF_MODEL_FRAME.search(n)
        if m:
            found = True
            if m.group(3):
                archs.add(m.group(3))
    return sorted(archs) if found else None
