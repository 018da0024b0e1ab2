"""untuned-fused-moe: tune SGLang's own fused-MoE Triton kernel for the served batch sizes and install
the config file where SGLang's loader reads it. See README.md beside this file."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Optional

from perfscope.analysis.moe_config import (
    CONFIG_KEYS,
    LOADER_RELDIR,
    config_file_name,
    lookup,
    moe_shape,
    version_dir,
)
from perfscope.fixengine.model import Detection, Environment, FixModule, StrategyChoice, TargetSpec
from perfscope.util import jsonio

HERE = Path(__file__).resolve().parent
SPEC = TargetSpec(
    "sglang-moe-config",
    f"{LOADER_RELDIR}/configs/triton_<version>/E=..,N=..,device_name=...json",
    "0.5.13.post1 - 0.5.23",
    ("tune",),
    description="the tuned fused-MoE config SGLang loads (created)",
    creates=True,
)
BUDGET_S = 240.0
MAX_BATCHES = 4


def served_batches(env: Environment) -> list[int]:
    """Decode batch sizes to tune: 1, the batches the trace decoded (SGLang's ``step[DECODE bs=N]``,
    the finding's ``decode_batches``), the concurrency the fix re-measures at (``--bench-concurrency``),
    and the server's largest decode batch (its CUDA-graph bound or max running requests), at most
    MAX_BATCHES of them: the smallest, the largest and those between nearest the measured concurrency.
    SGLang runs a batch on the config of the nearest tuned size, so a size left out runs another's."""
    facts = env.facts or {}
    seen = {1}
    want: set[int] = set()
    for f in facts.get("findings") or []:
        ev = (f.get("evidence") or {}) if isinstance(f, dict) else {}
        vals = [ev.get("batch")] + list(ev.get("decode_batches") or [])
        want |= {int(b) for b in vals if isinstance(b, (int, float)) and not isinstance(b, bool) and 1 <= b <= 4096}
    c = facts.get("bench_concurrency")
    measured = c if isinstance(c, int) and not isinstance(c, bool) and 1 <= c <= 4096 else None
    if measured is not None:
        want.add(measured)
    seen |= want
    args = env.server_args or facts.get("server_info") or {}
    for k in ("cuda_graph_max_bs", "cuda_graph_max_bs_decode", "max_running_requests"):
        v = args.get(k)
        if isinstance(v, int) and not isinstance(v, bool) and v >= 1:
            seen.add(min(v, 512))
            break
    if len(seen) <= MAX_BATCHES:
        return sorted(seen)
    ends = {min(seen), max(seen)}
    target = measured if measured is not None else max(want, default=1)
    near = sorted(seen - ends, key=lambda b: (abs(b - target), b))
    return sorted(ends | set(near[: MAX_BATCHES - 2]))


class UntunedFusedMoeFix(FixModule):
    id = "untuned-fused-moe"
    title = "Tune SGLang's fused-MoE Triton kernel for the served batch sizes"
    answers = ("untuned-fused-moe",)
    targets = (SPEC,)
    strategies = ("tune",)
    requirements = {
        "tune": "the server's Python with SGLang 0.5.13.post1 - 0.5.23, its GPU (minutes of GPU time), "
        "the model's config.json readable on the host"
    }
    keep_only_if_faster = 0.02
    budget_s = BUDGET_S
    max_candidates = 0  # 0: the whole pruned space (tests on CPU cap it: Triton's interpreter is slow)

    def bound_s(self, env: Environment) -> float:
        """The tuning's bound: ``fix --budget`` (the request's ``budget_s``), else the fix's own."""
        b = (env.facts or {}).get("budget_s")
        return float(b) if isinstance(b, (int, float)) and not isinstance(b, bool) and b > 0 else self.budget_s

    # ---- facts read on the host
    def gather(self, host, env: Environment) -> None:
        f = env.facts
        if "moe" in f:
            return
        info: dict = {"could_not_read": []}
        f["moe"] = info
        if env.python and (not env.triton_version or not env.gpu_name):
            r = host.run(
                [
                    env.python,
                    "-c",
                    "import json, triton, torch; print(json.dumps([triton.__version__, "
                    "torch.cuda.get_device_name() if torch.cuda.is_available() else None]))",
                ],
                timeout=120,
            )
            try:
                tv, dev = json.loads(r.stdout.strip().splitlines()[-1])
                env.triton_version = env.triton_version or tv
                env.gpu_name = env.gpu_name or dev
            except (ValueError, IndexError):
                info["could_not_read"].append(f"Triton version / GPU name with {env.python}")
        args = env.server_args or f.get("server_info") or {}
        shape = None
        for fd in f.get("findings") or []:
            ev = fd.get("evidence") or {} if isinstance(fd, dict) else {}
            if fd.get("id") == self.id and isinstance(ev.get("moe_shape"), dict):
                m = ev["moe_shape"]
                shape = {"E": m["E"], "N": m["N"], "hidden": m["hidden"], "topk": m["top_k"]}
        mp = args.get("model_path")
        if shape is None and isinstance(mp, str) and mp:
            p = mp.rstrip("/") + "/config.json"
            try:
                mc = jsonio.loads(host.read_bytes(p), p, expect=dict)
            except Exception as e:  # noqa: BLE001 - one line in the report
                info["could_not_read"].append(f"{p}: {e}")
            else:
                s = moe_shape(mc, int(args.get("tp_size") or 1), int(args.get("ep_size") or 1))
                if s:
                    shape = {"E": s.experts, "N": s.intermediate, "hidden": s.hidden, "topk": s.top_k}
        if shape is None:
            info["could_not_read"].append(
                "the model's MoE shape: give --url (the server's /server_info names its "
                "model_path; its config.json is read on the host) or --trace RUN recorded "
                "from the server"
            )
            return
        info["shape"] = shape
        if env.gpu_name and env.triton_version:
            info["name"] = config_file_name(shape["E"], shape["N"], env.gpu_name)
            info["version_dir"] = version_dir(env.triton_version)
            if env.sglang_root:
                root = env.sglang_root.rstrip("/") + "/" + LOADER_RELDIR + "/configs"
                r = host.run(["ls", "-1", root], timeout=30)
                dirs = r.stdout.split() if r.rc == 0 else []
                kind, where = lookup(
                    dirs, lambda d, n: host.exists(f"{root}/{d}/{n}"), info["name"], env.triton_version
                )
                info["loads_now"] = {"kind": kind, "folder": where}
        info["batches"] = served_batches(env)

    def target_for(self, env: Environment, name: Optional[str]) -> TargetSpec:
        if name not in (None, SPEC.name):
            raise KeyError(name)
        m = (env.facts or {}).get("moe") or {}
        if not m.get("name"):
            why = "; ".join(m.get("could_not_read") or []) or "the GPU name and Triton version are unknown"
            return TargetSpec(SPEC.name, None, SPEC.versions, SPEC.strategies, description=why, creates=True)
        return TargetSpec(
            SPEC.name,
            f"{LOADER_RELDIR}/configs/{m['version_dir']}/{m['name']}",
            SPEC.versions,
            SPEC.strategies,
            description=SPEC.description,
            creates=True,
        )

    def detect(self, target: TargetSpec, data: bytes, env: Environment) -> Detection:
        m = (env.facts or {}).get("moe") or {}
        now = m.get("loads_now") or {}
        facts = {"shape": m.get("shape"), "batches": m.get("batches"), "loads_now": now, "budget_s": self.bound_s(env)}
        if data:
            try:
                cfg = json.loads(data)
                ok = isinstance(cfg, dict) and all(str(k).isdigit() and isinstance(v, dict) for k, v in cfg.items())
            except ValueError:
                ok = False
            if not ok:
                return Detection(
                    target.name, None, "refused", f"{target.relpath} exists and is not an SGLang MoE config"
                )
            return Detection(
                target.name,
                "tuned",
                "patched",
                "a tuned config for this shape is installed",
                patched_strategy="tune",
                facts=facts,
            )
        variant = now.get("kind") or "default"
        if variant == "fallback":
            facts["notes"] = [f"SGLang loads this shape's config from {now.get('folder')} (another Triton version)"]
        elif now:
            facts["notes"] = ["SGLang has no tuned config for this shape in its install: it runs its default config"]
        else:
            facts["notes"] = ["what SGLang loads now was not read (its install's configs folder is unknown)"]
        return Detection(
            target.name, variant, "original", f"no config for this Triton version ({variant})", facts=facts
        )

    def choose_strategy(self, target, det, env, requested="auto") -> StrategyChoice:
        if requested not in ("auto", "tune"):
            return StrategyChoice(None, f"unknown strategy {requested}; this fix knows: tune")
        b = det.facts.get("batches") or [1]
        n = len(b)
        return StrategyChoice(
            "tune",
            f"tune SGLang's kernel at batch {', '.join(map(str, b))} ({n} sizes, pruned "
            f"space, bounded at {self.bound_s(env):.0f} s of GPU time on the server's GPU)",
        )

    def tune_argv(self, env: Environment, det: Detection, out: str, script: str) -> list[str]:
        s = det.facts["shape"]
        return [
            env.python or "python3",
            script,
            "--E",
            str(s["E"]),
            "--N",
            str(s["N"]),
            "--hidden",
            str(s["hidden"]),
            "--topk",
            str(s["topk"]),
            "--batches",
            ",".join(map(str, det.facts.get("batches") or [1])),
            "--budget-s",
            str(self.bound_s(env)),
            "--out",
            out,
        ] + (["--max-candidates", str(self.max_candidates), "--iters", "1"] if self.max_candidates else [])

    def prepare(self, host, env, target, path, det) -> Optional[str]:
        """Run the tuner on the host (bounded); its winners become the file's bytes."""
        if not det.facts.get("shape"):
            return "the model's MoE shape is unknown: nothing to tune"
        r = host.run(["mktemp", "-d", "/tmp/perfscope-moe-tune.XXXXXX"])
        tmp = r.stdout.strip()
        if r.rc != 0 or not tmp:
            return f"cannot make a temp folder on {host.label}"
        try:
            script, out = tmp + "/tune_script.py", tmp + "/tuned.json"
            host.write_bytes_atomic(script, (HERE / "tune_script.py").read_bytes())
            r = host.run(self.tune_argv(env, det, out, script), timeout=self.bound_s(env) + 300)
            try:
                res = json.loads(r.stdout.strip().splitlines()[-1])
            except (ValueError, IndexError):
                return (
                    f"the tuner did not run (rc {r.rc}): {(r.stderr or '').strip().splitlines()[-1:] or ['no output']}"
                )
            det.facts["tune"] = {k: res.get(k) for k in ("per_batch", "elapsed_s", "stopped", "tried", "planned")}
            if not res.get("ok") or not host.exists(out):
                return f"tuning gave no config: {res.get('reason') or res.get('per_batch')}"
            det.facts["tuned"] = host.read_bytes(out)
        finally:
            host.run(["rm", "-rf", "--", tmp])
        return None

    def transform(self, target, det, data, strategy):
        tuned = det.facts.get("tuned")
        notes = []
        if tuned is None:  # the check: the file's form, with SGLang's defaults for these sizes as the values
            from importlib import util

            spec = util.spec_from_file_location("perfscope_moe_tune_script", HERE / "tune_script.py")
            mod = util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            e = (det.facts.get("shape") or {}).get("E", 1)
            tuned = (
                json.dumps({str(b): mod.default_config(b, e) for b in det.facts.get("batches") or [1]}, indent=4) + "\n"
            ).encode()
            notes.append(
                "the values shown are SGLang's defaults for these batch sizes: --apply replaces them with "
                "the tuner's winners"
            )
            argv = self.tune_argv(
                Environment(python="PYTHON", facts={"budget_s": det.facts.get("budget_s")}),
                det,
                "OUT",
                "tune_script.py",
            )
            notes.append("tuning runs on the server's GPU: " + " ".join(shlex.quote(x) for x in argv))
        else:
            for m, v in (det.facts.get("tune") or {}).get("per_batch", {}).items():
                notes.append(
                    f"batch {m}: default {v.get('default_us')} us, tuned {v.get('best_us')} us "
                    f"({v.get('tried')} configs tried)"
                )
        return tuned, notes

    def postconditions(self, target, det, before, after, strategy) -> list[str]:
        try:
            cfg = json.loads(after)
        except ValueError as e:
            return [f"not JSON: {e}"]
        if not isinstance(cfg, dict) or not cfg:
            return ["not a non-empty object"]
        bad = [
            k
            for k, v in cfg.items()
            if not str(k).isdigit()
            or not isinstance(v, dict)
            or not set(v) <= set(CONFIG_KEYS)
            or not all(isinstance(x, int) for x in v.values())
        ]
        return [f"entries not in SGLang's format: {bad[:3]}"] if bad else []


FIX = UntunedFusedMoeFix()
