"""Tensor parallelism for the reproduction server: ``--tp-size N`` runs N processes, one per rank.

Layout, as SGLang runs an MLA model with TP (DeepSeek, ``--tp N``):

* rank 0 is the process that was started: it serves HTTP, runs the scheduler, and before each
  forward broadcasts the batch (mode, token ids, the pool rows each request reads and writes) and
  any profiler control to the other ranks over a gloo group (SGLang's scheduler does the same
  per TP rank with ``broadcast_pyobj`` on its CPU group). Ranks 1..N-1 are child processes
  (``python -m <this package> ... --tp-rank r``) that loop: receive, run the same forward, repeat.
* attention heads are split across ranks (``--num-heads`` is the total); the latent KV (512+64)
  and its FP8 pool are replicated on every rank, as SGLang's MLA TP does, so the whole-pool cast
  runs on every rank;
* per layer, one all-reduce after the attention output projection and one after the MLP's second
  projection (SGLang's ``RowParallelLinear`` with ``reduce_results``). The MLP exists only in TP
  mode (``--mlp-size``, the total intermediate size, split across ranks);
* each rank has its own torch profiler: ``/start_profile`` is applied on every rank with one
  ``profile_id``, so one profile writes ``{id}-TP-{r}[-EXTEND|-DECODE].trace.json.gz`` per rank;
  with ``--api vllm``, each rank has vLLM's worker profiler (one ``*.pt.trace.json[.gz]`` per
  worker), and ``/stop_profile`` replies once every rank wrote its trace, as vLLM's does.

Backends: gloo on CPU; NCCL on CUDA (rank r on ``cuda:(base + r)``), always with
``NCCL_NVLS_ENABLE=0`` and ``TORCH_SYMM_MEM_DISABLE_MULTICAST=1`` (NVLink multicast stays off).
``--allreduce custom`` (CUDA only) uses torch symmetric memory's one-shot all-reduce (P2P loads,
no multicast); when it is unavailable or fails its start-up check against NCCL, the server logs
why, reports ``custom_all_reduce_error`` in ``/server_info`` and uses NCCL.

``--straggler-rank R --straggler-ms X`` makes rank R sleep X ms in every forward, inside the step
annotation; ``--straggler-at`` picks where: ``tail`` (default: after the last all-reduce, before
sampling, so only rank R's step grows and the others wait for it outside their step, in the next
batch broadcast) or ``head`` (before the first layer, so the other ranks wait for it inside
their first all-reduce of the step: every rank's step grows by X, and only the communication
time tells the ranks apart).
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import socket
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Optional

log = logging.getLogger("repro_server")

# never enable NVLink multicast (NVLS / multimem): set for every rank, whatever the caller's environment says
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}


def add_tp_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("tensor parallelism (tp.py)")
    g.add_argument("--tp-size", type=int, default=1, help="ranks (processes); heads split across them")
    g.add_argument("--tp-rank", type=int, default=0, help=argparse.SUPPRESS)  # set for the child ranks
    g.add_argument("--tp-master-port", type=int, default=0, help=argparse.SUPPRESS)
    g.add_argument("--allreduce", default="nccl", choices=["nccl", "custom"],
                   help="CUDA: nccl, or custom (torch symmetric-memory one-shot all-reduce, no multicast; "
                        "falls back to NCCL when unavailable). CPU: always gloo")
    g.add_argument("--mlp-size", type=int, default=None,
                   help="TP mode: total MLP intermediate size (default 2 x hidden)")
    g.add_argument("--straggler-rank", type=int, default=None, help="rank that sleeps --straggler-ms per forward")
    g.add_argument("--straggler-ms", type=float, default=0.0)
    g.add_argument("--straggler-at", default="tail", choices=["tail", "head"],
                   help="tail: after the last all-reduce of the step; head: before the first layer")


# ------------------------------------------------------------------------------------ the TP context


class TPContext:
    """Process groups and the all-reduce of one rank (module-level singleton: :data:`CTX`)."""

    def __init__(self, args, rank: int):
        import torch
        import torch.distributed as dist

        self.args = args
        self.rank = rank
        self.size = args.tp_size
        self.outbox: list[tuple[str, dict]] = []  # rank 0: profiler control for the other ranks
        self.straggler_s = (args.straggler_ms / 1e3
                            if args.straggler_rank is not None and args.straggler_rank == rank else 0.0)
        self.children: list[subprocess.Popen] = []
        os.environ.update(SAFE_ENV)
        dev = args.device
        self.cuda = dev.startswith("cuda")
        if self.cuda:
            base = int(dev.split(":")[1]) if ":" in dev else 0
            self.device = torch.device("cuda", base + rank)
            torch.cuda.set_device(self.device)
        else:
            self.device = torch.device("cpu")
        init = f"tcp://127.0.0.1:{args.tp_master_port}"
        long = timedelta(hours=24)  # an idle server leaves the workers waiting for the next batch
        kw = dict(init_method=init, rank=rank, world_size=self.size, timeout=long)
        if self.cuda:
            dist.init_process_group("nccl", device_id=self.device, **kw)
        else:
            dist.init_process_group("gloo", **kw)
        self.group = dist.group.WORLD
        self.cpu_group = dist.new_group(backend="gloo", timeout=long)  # batches and control, like SGLang's
        self.allreduce_kind = "gloo" if not self.cuda else "nccl"
        self.custom_error: Optional[str] = None
        self._symm = None
        if self.cuda and args.allreduce == "custom":
            self._setup_custom()

    def trace_written(self) -> None:
        """Every rank waits here after a stop: rank 0's reply then follows the last trace file."""
        import torch.distributed as dist

        dist.barrier(group=self.cpu_group)

    # one-shot all-reduce over torch symmetric memory (P2P loads over NVLink; no multimem/multicast)
    def _setup_custom(self) -> None:
        import torch
        import torch.distributed as dist

        err = None
        try:
            import torch.distributed._symmetric_memory as symm_mem

            if not hasattr(torch.ops.symm_mem, "one_shot_all_reduce"):
                raise RuntimeError("torch.ops.symm_mem.one_shot_all_reduce is not in this torch build")
            for peer in range(self.size):
                if peer != self.rank and not torch.cuda.can_device_access_peer(self.device, self.device.index - self.rank + peer):
                    raise RuntimeError(f"cuda:{self.device.index} cannot access its peer rank {peer} (no P2P)")
        except Exception as e:  # noqa: BLE001 - reported, NCCL is used instead
            err = f"{type(e).__name__}: {e}"
        if not self._agree(err is None):
            self.custom_error = err or "another rank cannot run the custom all-reduce"
            log.warning("custom all-reduce unavailable, using NCCL: %s", self.custom_error)
            return
        try:
            H = self.args._hidden
            rows = self.args._max_tokens
            self._symm_numel = rows * H
            buf = symm_mem.empty(self._symm_numel, dtype=torch.bfloat16, device=self.device)
            symm_mem.rendezvous(buf, self.group)
            self._symm_buf = buf
            self._group_name = self.group.group_name
            # start-up check against NCCL on a known input
            x = torch.arange(7 * H, device=self.device, dtype=torch.float32).remainder(13).sub(6).to(torch.bfloat16)
            x = x * (self.rank + 1)
            want = x.clone()
            dist.all_reduce(want, group=self.group)
            got = self._custom(x.view(7, H))
            torch.cuda.synchronize()
            if not torch.equal(got.view(-1), want):
                raise RuntimeError(f"one-shot all-reduce differs from NCCL (max abs diff "
                                   f"{(got.view(-1).float() - want.float()).abs().max().item()})")
        except Exception as e:  # noqa: BLE001
            err = f"{type(e).__name__}: {e}"
        if self._agree(err is None):
            self.allreduce_kind = "custom"
            log.info("custom all-reduce: torch symm_mem one_shot_all_reduce (multicast off)")
        else:
            self.custom_error = err or "another rank failed the custom all-reduce check"
            log.warning("custom all-reduce failed its check, using NCCL: %s", self.custom_error)

    def _agree(self, ok: bool) -> bool:
        """True when every rank says ok (a MIN over the gloo group)."""
        import torch
        import torch.distributed as dist

        t = torch.tensor([1 if ok else 0], dtype=torch.int32)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.cpu_group)
        return bool(t.item())

    def _custom(self, x):
        import torch

        n = x.numel()
        if n > self._symm_numel:  # larger than the buffer (a long prefill): NCCL
            return self._nccl(x)
        flat = x.reshape(-1)
        dst = self._symm_buf[:n]
        dst.copy_(flat)
        out = torch.ops.symm_mem.one_shot_all_reduce(dst, "sum", self._group_name)
        return out.view_as(x)

    def _nccl(self, x):
        import torch.distributed as dist

        x = x.contiguous()
        dist.all_reduce(x, group=self.group)
        return x

    def all_reduce(self, x):
        if self.allreduce_kind == "custom":
            return self._custom(x)
        return self._nccl(x)

    # ----------------------------------------------------------------- batch / control broadcast
    # gloo's broadcast returns on the root as soon as the bytes are sent: the barrier after it keeps
    # the ranks in lockstep here, outside the step annotation, so a rank that is late after its last
    # collective makes the others wait before their next step, not inside it (as SGLang's scheduler)
    def send(self, msg: dict) -> None:
        import torch.distributed as dist

        dist.broadcast_object_list([msg], src=0, group=self.cpu_group)
        dist.barrier(group=self.cpu_group)

    def recv(self) -> dict:
        import torch.distributed as dist

        box = [None]
        dist.broadcast_object_list(box, src=0, group=self.cpu_group)
        dist.barrier(group=self.cpu_group)
        return box[0]

    def server_info(self, runner) -> dict:
        cfg = runner.model_config
        return {
            "tp_size": self.size, "tp_backend": "nccl" if self.cuda else "gloo",
            "allreduce": self.allreduce_kind, "allreduce_requested": self.args.allreduce,
            "disable_custom_all_reduce": self.allreduce_kind != "custom",
            "custom_all_reduce_error": self.custom_error,
            "nccl_nvls_enable": os.environ.get("NCCL_NVLS_ENABLE"),
            "torch_symm_mem_disable_multicast": os.environ.get("TORCH_SYMM_MEM_DISABLE_MULTICAST"),
            "num_attention_heads_per_rank": runner.local_heads, "mlp_size": runner.mlp_size,
            "allreduces_per_layer": 2,
            # the floor model divides these by tp_size: the sum over ranks (the latent KV projection
            # is replicated, so it is counted once per rank)
            "weight_bytes_per_layer": runner.local_weight_bytes_per_layer * self.size,
            "weight_bytes": runner.local_weight_bytes_per_layer * self.size * cfg.num_hidden_layers,
            "straggler": ({"rank": self.args.straggler_rank, "ms": self.args.straggler_ms, "at": self.args.straggler_at}
                          if self.args.straggler_rank is not None and self.args.straggler_ms > 0 else None),
        }


CTX: Optional[TPContext] = None


# ------------------------------------------------------------------------------------ model & scheduler


def _runner_classes():
    import torch

    from .model import ModelConfig, ModelRunner, _rmsnorm
    from .scheduler import ProfileError, Scheduler

    class TPModelRunner(ModelRunner):
        """This rank's shard: ``num_attention_heads / tp`` heads, ``mlp_size / tp`` MLP columns."""

        def __init__(self, cfg: ModelConfig, **kw):
            ctx = CTX
            tp = ctx.size
            if cfg.num_attention_heads % tp:
                raise ValueError(f"--num-heads {cfg.num_attention_heads} is not divisible by --tp-size {tp}")
            self.total_heads = cfg.num_attention_heads
            self.local_heads = cfg.num_attention_heads // tp
            local = ModelConfig(**{**cfg.__dict__, "num_attention_heads": self.local_heads})
            kw["device"] = str(ctx.device)
            super().__init__(local, **kw)
            self.full_config = cfg
            mlp = ctx.args.mlp_size or 2 * cfg.hidden_size
            if mlp % tp:
                raise ValueError(f"--mlp-size {mlp} is not divisible by --tp-size {tp}")
            self.mlp_size = mlp
            H, I = cfg.hidden_size, mlp // tp
            g = torch.Generator(device=self.device).manual_seed(kw.get("seed", 0) * 1000 + 17 + ctx.rank)
            dev, dt = self.device, self.dtype

            def rnd(*shape, fan_in):
                w = torch.randn(*shape, generator=g, device=dev, dtype=torch.float32)
                return w.div_(math.sqrt(fan_in)).to(dt)

            self.mlp = [(torch.ones(H, dtype=dt, device=dev), rnd(H, I, fan_in=H), rnd(I, H, fan_in=mlp))
                        for _ in range(local.num_hidden_layers)]
            self.local_weight_bytes_per_layer = local.weight_bytes_per_layer() + 2 * H * I * 2

        @torch.inference_mode()
        def forward(self, fb):
            ar = CTX.all_reduce
            if CTX.straggler_s and CTX.args.straggler_at == "head":
                time.sleep(CTX.straggler_s)
            x = self.embed[fb.input_ids]
            for lw, layer, (n2, w_up, w_down) in zip(self.layers, self.attn_layers, self.mlp):
                # column-parallel q (local heads) + replicated latent KV, then row-parallel o_proj
                x = x + ar(self.attention(x, lw, layer, fb) @ lw.w_out)  # all-reduce 1
                h = _rmsnorm(x, n2)
                x = x + ar(torch.nn.functional.silu(h @ w_up) @ w_down)  # row-parallel down: all-reduce 2
            if fb.last_token_index is not None:
                x = x[fb.last_token_index]
            logits = _rmsnorm(x, self.final_norm) @ self.lm_head
            if CTX.straggler_s and CTX.args.straggler_at == "tail":
                time.sleep(CTX.straggler_s)  # after the last all-reduce: the other ranks do not wait in-step
            return logits

        def build_batch(self, mode, input_ids, slots, new_slots):
            if CTX.rank == 0:  # the scheduler's batch, to every rank, before the step starts
                CTX.send({"control": _take_outbox(), "step": (mode.name, input_ids, slots, new_slots)})
            return super().build_batch(mode, input_ids, slots, new_slots)

    def _take_outbox():
        out, CTX.outbox = CTX.outbox, []
        return out

    class TPScheduler(Scheduler):
        """Rank 0's scheduler: profiler control is applied here and forwarded to the other ranks."""

        def _process_control(self) -> None:
            import queue

            sent = False
            done = []  # replies wait until the other ranks have the control (vLLM: wrote their traces)
            while True:
                try:
                    kind, payload, fut = self.control.get_nowait()
                except queue.Empty:
                    break
                try:
                    if kind == "start_profile":
                        payload = dict(payload)
                        payload.setdefault("profile_id", str(time.time()))  # one id: one file name per rank
                        fut_result = self.profiler.init(payload)
                        CTX.outbox.append(("start_profile", payload))
                    elif kind == "stop_profile":
                        fut_result = self.profiler.stop_all()
                        CTX.outbox.append(("stop_profile", {}))
                    else:
                        raise ValueError(f"unknown control {kind}")
                    done.append((fut, fut_result))
                    sent = True
                except BaseException as e:  # noqa: BLE001 - handed back to the HTTP thread
                    fut.set_exception(e)
            try:
                if sent:  # the other ranks get it now, not at the next batch (there may be none)
                    control = _take_outbox()
                    CTX.send({"control": control, "step": None})
                    if CTX.args.api == "vllm" and any(k == "stop_profile" for k, _ in control):
                        CTX.trace_written()
            finally:  # whatever happened to the other ranks, rank 0's own result is the reply
                for fut, result in done:
                    fut.set_result(result)

        def shutdown(self) -> None:
            super().shutdown()
            if not self.thread.is_alive():
                try:
                    CTX.send({"control": [], "step": None, "exit": True})
                except Exception as e:  # noqa: BLE001
                    log.warning("could not tell the other ranks to exit: %s", e)
            _reap_children(timeout=20)

    return TPModelRunner, TPScheduler, ProfileError


# ------------------------------------------------------------------------------------ processes


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _package_root() -> tuple[str, str]:
    """(module name of this package, the folder to put on PYTHONPATH to import it)."""
    pkg = __package__ or "examples.repro_server"
    root = Path(__file__).resolve().parents[len(pkg.split("."))]
    return pkg, str(root)


def _reap_children(timeout: float) -> None:
    if CTX is None:
        return
    deadline = time.monotonic() + timeout
    for c in CTX.children:
        try:
            c.wait(max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            c.terminate()
            try:
                c.wait(5)
            except subprocess.TimeoutExpired:
                c.kill()


def _watch_children(children: list[subprocess.Popen], stopping: threading.Event) -> None:
    """A rank that dies leaves the others blocked in a collective: end the whole server."""
    while not stopping.is_set():
        for c in children:
            rc = c.poll()
            if rc is not None and not stopping.is_set():
                log.error("TP rank process %d exited with %s: stopping the server", c.pid, rc)
                for o in children:
                    if o.poll() is None:
                        o.kill()
                os._exit(1)
        time.sleep(0.5)


class Rank0:
    """What app.main needs from TP on rank 0: the classes to build, extra server_info."""

    def __init__(self, runner_cls, scheduler_cls):
        self.runner_cls = runner_cls
        self.scheduler_cls = scheduler_cls
        self.stopping = threading.Event()

    def update_info(self, info: dict, runner) -> None:
        extra = CTX.server_info(runner)
        info.update(extra)
        if isinstance(info.get("model_config"), dict):
            info["model_config"] = {**info["model_config"], "mlp_size": extra["mlp_size"],
                                    "weight_bytes_per_layer": extra["weight_bytes_per_layer"],
                                    "weight_bytes": extra["weight_bytes"]}


def launch(args, argv: list[str], presets: dict) -> Rank0:
    """Rank 0: start ranks 1..N-1 as child processes, join the process groups, return the classes."""
    global CTX
    _resolve_sizes(args, presets)
    if args.tp_size < 1:
        raise SystemExit("--tp-size must be >= 1")
    if args.straggler_rank is not None and not 0 <= args.straggler_rank < args.tp_size:
        raise SystemExit(f"--straggler-rank {args.straggler_rank} is not a rank of --tp-size {args.tp_size}")
    args.tp_master_port = _free_port()
    pkg, root = _package_root()
    env = {**os.environ, **SAFE_ENV}
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    children = []
    for r in range(1, args.tp_size):
        cmd = [sys.executable, "-m", pkg, *argv, "--tp-rank", str(r), "--tp-master-port", str(args.tp_master_port)]
        children.append(subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=sys.stderr))
    CTX = TPContext(args, 0)
    CTX.children = children
    runner_cls, sched_cls, _ = _runner_classes()
    r0 = Rank0(runner_cls, sched_cls)
    threading.Thread(target=_watch_children, args=(children, r0.stopping), daemon=True).start()
    import atexit

    atexit.register(r0.stopping.set)
    log.info("TP: %d ranks (%s), all-reduce %s", args.tp_size, "nccl" if CTX.cuda else "gloo", CTX.allreduce_kind)
    return r0


def _resolve_sizes(args, presets: dict) -> None:
    p = presets["cuda" if args.device.startswith("cuda") else "cpu"]
    args._hidden = args.hidden_size or p["hidden_size"]
    args._max_tokens = 64 * 1024  # symmetric buffer rows (tokens per forward) for the custom all-reduce


def worker_main(args, presets: dict) -> int:
    """Ranks 1..N-1: build the same model shard, then run whatever rank 0 broadcasts, until it says exit."""
    global CTX
    import signal

    import torch

    from .model import ForwardMode, config_from_args
    from .model import CudaGraphRunner
    from .scheduler import ProfilerManager

    signal.signal(signal.SIGTERM, lambda *a: os._exit(0))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C reaches rank 0, which tells us to exit
    _resolve_sizes(args, presets)
    if args.threads:
        torch.set_num_threads(args.threads)
    CTX = TPContext(args, args.tp_rank)
    runner_cls, _, ProfileError = _runner_classes()
    cfg, pick = config_from_args(args, presets)
    use_fi = False if args.no_flashinfer else None
    runner = runner_cls(cfg, max_total_tokens=pick("max_total_tokens"), device=args.device,
                        kv_strategy=args.kv_strategy, flashinfer_backend=args.flashinfer_backend,
                        use_flashinfer=use_fi, seed=args.seed)
    graph = CudaGraphRunner(runner, args.cuda_graph_max_bs, pick("context_length")) if args.cuda_graph else None
    vllm = args.api == "vllm"
    if vllm and args.torch_profiler_dir:
        from .vllm_api import make_profiler

        prof = make_profiler(runner.device, args, CTX.rank)
    else:
        prof = ProfilerManager(runner.device, tp_rank=CTX.rank)
    log.info("TP rank %d ready on %s", CTX.rank, runner.device)
    while True:
        msg = CTX.recv()
        stopped = False
        for kind, payload in msg.get("control") or []:
            try:
                if kind == "start_profile":
                    prof.init(payload)
                elif kind == "stop_profile":
                    stopped = True
                    prof.stop_all()
            except ProfileError as e:
                log.warning("rank %d: %s", CTX.rank, e)
        if stopped and vllm:
            CTX.trace_written()  # vLLM's /stop_profile replies once every worker wrote its trace
        if msg.get("exit"):
            break
        step = msg.get("step")
        if not step:
            continue
        mode_name, ids, ctx, new = step
        mode = ForwardMode[mode_name]
        fb = runner.build_batch(mode, ids, ctx, new)
        tag = (f"step[DECODE bs={len(ids)}]" if mode.is_decode()
               else f"step[EXTEND bs={len(ids)} toks={sum(len(i) for i in ids)}]")
        prof.before_forward(mode)
        with torch.profiler.record_function(tag):
            if graph is not None and graph.can_run(fb):
                logits = graph.replay(fb)
            else:
                logits = runner.run_batch(fb)
            logits.argmax(-1).tolist()  # every rank samples in SGLang; rank 0's tokens are the ones kept
        if runner.device.type == "cuda":
            torch.cuda.synchronize()
        prof.after_forward()
    if prof.in_progress:
        prof.stop_all()
    import torch.distributed as dist

    dist.destroy_process_group()
    return 0
