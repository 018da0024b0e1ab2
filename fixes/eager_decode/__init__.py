"""eager-decode: decode back under CUDA graphs, on the server's launch command.

SGLang: drop ``--disable-cuda-graph``; and when the trace saw decode batches larger than
``--cuda-graph-max-bs`` (SGLang runs those eagerly), raise it to cover them. vLLM: drop
``--enforce-eager``. perfscope's reproduction server: add ``--cuda-graph`` (its graphs are opt-in).
See README.md beside this file.
"""

from __future__ import annotations

import re

from perfscope.fixengine.flags import Decision, Flag, LaunchFlagFix, as_value
from perfscope.fixengine.launch import FlagChange

DISABLE = Flag("--disable-cuda-graph", "disable_cuda_graph")
DISABLE_DECODE = Flag("--disable-decode-cuda-graph", "disable_decode_cuda_graph")  # 0.5.2x
BACKEND_DECODE = Flag("--cuda-graph-backend-decode", "cuda_graph_backend_decode", takes_value=True)  # 0.5.2x
MAX_BS = Flag("--cuda-graph-max-bs", "cuda_graph_max_bs", takes_value=True)  # up to 0.5.1x
MAX_BS_DECODE = Flag("--cuda-graph-max-bs-decode", "cuda_graph_max_bs_decode", takes_value=True)  # 0.5.2x
ENFORCE_EAGER = Flag("--enforce-eager", "enforce_eager")
REPRO_GRAPH = Flag("--cuda-graph", None)


def graph_max_bs_for(seen: int) -> int:
    """The smallest value of SGLang's capture list that covers ``seen`` (1, 2, 4, 8, then steps of 8)."""
    for v in (1, 2, 4, 8):
        if seen <= v:
            return v
    return -(-seen // 8) * 8


def batch_sizes(finding: dict, env) -> list[int]:
    ev = finding.get("evidence") or {}
    bs = ev.get("decode_batch_sizes") or []
    if not bs:  # step labels of the trace, when the finding did not carry them
        for lab in (env.facts or {}).get("step_labels") or []:
            m = re.search(r"bs=(\d+)", lab)
            if m:
                bs.append(int(m.group(1)))
    return sorted({int(b) for b in bs if isinstance(b, (int, float)) or str(b).isdigit()})


def max_bs_flag(args: dict, current: dict) -> str:
    """SGLang renamed --cuda-graph-max-bs to --cuda-graph-max-bs-decode (0.5.2x): the server's
    /server_info keys say which one this version has; without them, the one the launch command uses."""
    if "cuda_graph_max_bs_decode" in args:
        return MAX_BS_DECODE.flag
    if "cuda_graph_max_bs" in args:
        return MAX_BS.flag
    return MAX_BS_DECODE.flag if current.get(MAX_BS_DECODE.flag) is not None else MAX_BS.flag


def served_max_bs(args: dict):
    """The decode graphs' largest batch as the server resolved it (0.5.2x: cuda_graph_config)."""
    cfg = args.get("cuda_graph_config")
    if isinstance(cfg, dict) and isinstance(cfg.get("decode"), dict):
        v = as_value(cfg["decode"].get("max_bs"))
        if v is not None:
            return v
    return as_value(args.get("cuda_graph_max_bs_decode")) or as_value(args.get("cuda_graph_max_bs"))


class EagerDecodeFix(LaunchFlagFix):
    id = "eager-decode"
    title = "Run decode under CUDA graphs (drop --disable-cuda-graph, cover the batch sizes seen)"
    answers = ("eager-decode",)
    engines = ("sglang", "vllm", "repro")
    flags = {
        "sglang": (DISABLE, DISABLE_DECODE, BACKEND_DECODE, MAX_BS, MAX_BS_DECODE),
        "vllm": (ENFORCE_EAGER,),
        "repro": (REPRO_GRAPH, MAX_BS),
    }
    assumed = {"--disable-cuda-graph": True}
    required_keys = ("disable_cuda_graph",)
    requirements = {
        "flags": "a CUDA GPU (the server's /server_info device is not cpu); SGLang whose "
        "/server_info reports disable_cuda_graph, and cuda_graph_max_bs (up to 0.5.1x) or "
        "cuda_graph_max_bs_decode (0.5.2x) when the max batch size must change"
    }

    def decide(self, engine: str, current: dict, env) -> Decision:
        args = env.server_args or {}
        dev = str(args.get("device") or "")
        if dev and not dev.startswith("cuda") and dev != "auto":
            return Decision([], refused=f"the server runs on {dev}: CUDA graphs need a CUDA GPU; nothing changed")
        f = self.finding(env, "eager-decode")
        pred = f.get("predicted_step_ms_after_fix")
        how = "the step minus the GPU idle time between launches" if pred is not None else ""
        changes: list = []
        whys: list = []
        if engine == "vllm":
            if current.get("--enforce-eager"):
                changes.append(FlagChange("remove", "--enforce-eager", why="vLLM captures decode graphs by default"))
            return Decision(
                changes,
                why="drop --enforce-eager" if changes else "--enforce-eager is not set",
                predicted_step_ms=pred,
                prediction=how,
            )
        if engine == "sglang":
            for fl in (DISABLE, DISABLE_DECODE):
                if current.get(fl.flag):
                    changes.append(FlagChange("remove", fl.flag, why="SGLang captures decode graphs by default"))
                    whys.append(f"{fl.flag} turns the decode graphs off")
            if current.get(BACKEND_DECODE.flag) == "disabled":
                changes.append(
                    FlagChange(
                        "remove", BACKEND_DECODE.flag, takes_value=True, why="the default decode graph backend is full"
                    )
                )
                whys.append(f"{BACKEND_DECODE.flag} disabled turns the decode graphs off")
        if engine == "repro" and not current.get("--cuda-graph"):
            changes.append(FlagChange("add", "--cuda-graph", why="the reproduction server's graphs are opt-in"))
            whys.append("the reproduction server runs eagerly without --cuda-graph")
        seen = batch_sizes(f, env)
        mflag = max_bs_flag(args, current) if engine == "sglang" else MAX_BS.flag
        if engine == "sglang" and args and mflag.lstrip("-").replace("-", "_") not in args and seen:
            return Decision(
                [],
                refused="the server's /server_info has neither cuda_graph_max_bs nor "
                "cuda_graph_max_bs_decode: perfscope does not know this version's max "
                "batch size flag; nothing changed",
            )
        cur = as_value(current.get(mflag))
        if cur is None:
            cur = served_max_bs(args)
        if seen:
            want = graph_max_bs_for(max(seen))
            if cur is None or cur < max(seen):
                changes.append(FlagChange("set", mflag, str(want), why=f"the trace's decode batches reach {max(seen)}"))
                whys.append(
                    f"{mflag} {want}: the trace saw decode batch sizes up to {max(seen)} "
                    f"({', '.join(map(str, seen[-6:]))}); batches above "
                    f"{cur if cur is not None else 'the default'} run eagerly"
                )
            else:
                whys.append(f"{mflag} {cur} covers the batch sizes seen (up to {max(seen)})")
        elif cur is None:
            whys.append(f"no batch sizes in the trace: {mflag} left to the server's default")
        return Decision(changes, why="; ".join(whys), predicted_step_ms=pred, prediction=how)


FIX = EagerDecodeFix()
