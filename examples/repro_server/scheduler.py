"""The scheduler thread: batches requests, runs forwards, and drives the torch profiler the way
SGLang's scheduler does (``scheduler_components/profiler_manager.py``, 0.5.x, non-v2 path).

One thread owns the model. HTTP threads hand it requests and control messages (profile
start/stop) through queues; it processes control messages between forwards, like SGLang's
``process_input_requests``. Each forward is one profiler step, wrapped in a
``record_function("step[DECODE bs=N]")`` / ``step[EXTEND bs=N toks=T]`` annotation.

Two loops, as SGLang has (``event_loop_normal`` / ``event_loop_overlap``):

* normal (``--disable-overlap-schedule``; the default on CPU): build a batch, run it, wait for the
  GPU, read the sampled tokens back, stream them, repeat. The GPU idles during the host work.
* overlap (the default on CUDA, as in SGLang): step N+1 is launched before step N's tokens are
  read back. The sampled tokens stay on the device and are the next decode step's input ids
  directly; each step copies its tokens to pinned host memory asynchronously, and the host reads
  them (and streams them) while the GPU runs the next step. Building a batch and planning the
  attention read host arrays only, so launching never waits for the GPU. A request finishes when
  its result is read: at ``max_new_tokens`` nothing more is launched for it; at EOS the one step
  already launched for it is discarded (SGLang does the same). Batches with sampled requests
  (``temperature > 0``, sampled on the host) run synchronously, so the random stream is the
  normal loop's. Greedy tokens are the same in both loops.
"""

from __future__ import annotations

import gc
import logging
import os
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch

from .model import CudaGraphRunner, ForwardMode, ModelRunner

log = logging.getLogger("repro_server")


@dataclass
class Req:
    rid: str
    input_ids: list[int]
    max_new_tokens: int
    temperature: float = 0.0
    ignore_eos: bool = False
    out: "queue.Queue" = field(default_factory=queue.Queue)  # (kind, payload) items
    output_ids: list[int] = field(default_factory=list)
    slots: list[int] = field(default_factory=list)
    finished: bool = False
    created: float = field(default_factory=time.time)
    cancelled: bool = False
    # overlap loop
    launched: int = 0  # output tokens whose forward has been launched
    inflight: int = 0  # launched forwards whose tokens have not been read back yet
    last_tok: Optional[tuple] = None  # (device tensor, index): the latest sampled token, not read back
    slots_t: Optional[torch.Tensor] = None  # slots as a CPU int32 tensor (cheap page-table slices)


@dataclass
class _Launched:
    """A forward the overlap loop has launched and not yet read back."""

    mode: ForwardMode
    reqs: list
    tokens: torch.Tensor  # [bs] sampled token ids, on the device
    host: torch.Tensor  # the same, copied (asynchronously, pinned) to the host
    done: Optional[object]  # CUDA event after the host copy (None on CPU)
    ready: Optional[object] = None  # CUDA event the reader waits on (the next launch's, when there is one)
    t_launch: float = 0.0
    sync: bool = False  # tokens were sampled on the host (temperature > 0): host already exact
    host_tokens: Optional[list] = None


class ProfileError(Exception):
    pass


class ProfilerManager:
    """SGLang's non-stage and by-stage profiling, reduced to the torch profiler (CPU/GPU)."""

    def __init__(self, device: torch.device, tp_rank: int = 0):
        self.device = device
        self.tp_rank = tp_rank
        self.torch_profiler: Optional[torch.profiler.profile] = None
        self.in_progress = False
        self.armed = False
        self.by_stage = False
        self.forward_ct = 0
        self.target_forward_ct: Optional[int] = None
        self.start_forward_ct: Optional[int] = None  # start_step: the forward the profile starts at
        self.prefill_ct = self.decode_ct = 0
        self.target_stage_ct: Optional[int] = None
        self.current_stage: Optional[ForwardMode] = None
        self.files: list[str] = []

    # ------------------------------------------------------------------ control (scheduler thread)
    def init(self, req: dict) -> str:
        if self.in_progress or self.armed or self.start_forward_ct is not None:
            if req.get("profile_by_stage") or req.get("start_step"):
                raise ProfileError("Profiling is already in progress. Call /stop_profile first.")
            # SGLang 0.5.23: a plain start ignores that refusal and starts a new profiler, so the
            # running profile is thrown away without a file
            self._discard()
        output_dir = req.get("output_dir") or os.getenv("SGLANG_TORCH_PROFILER_DIR", "/tmp")
        acts = req.get("activities") or ["CPU", "GPU"]
        unknown = [a for a in acts if a not in ("CPU", "GPU", "MEM", "CUDA_PROFILER", "RPD")]
        if unknown:
            raise ProfileError(f"unknown profiler activities: {unknown}")
        if "MEM" in acts and self.device.type != "cuda":
            # real SGLang dies here (torch's CUDA memory history: "Found no NVIDIA driver"); the
            # emulator refuses instead (README: deliberate differences)
            raise ProfileError("MEM profiling needs a GPU (SGLang itself exits: Found no NVIDIA driver)")
        self.output_dir = Path(output_dir).expanduser()
        self.activities = acts
        self.with_stack = req.get("with_stack") is not False
        self.record_shapes = req.get("record_shapes") is not False  # SGLANG_PROFILE_RECORD_SHAPES default
        self.profile_id = req.get("profile_id") or str(time.time())
        self.prefix = req.get("profile_prefix") or ""
        self.by_stage = bool(req.get("profile_by_stage"))
        num_steps = req.get("num_steps")
        num_steps = int(num_steps) if num_steps else None
        start_step = req.get("start_step")
        if self.by_stage:
            self.prefill_ct = self.decode_ct = 0
            self.target_stage_ct = num_steps
            self.armed = True  # starts at the first forward of each stage
        elif start_step:
            # SGLang: profiler_start_forward_ct = max(start_step, forward_ct + 1), in its count; here
            # forward_ct counts finished forwards, so the next forward is forward_ct
            self.start_forward_ct = max(int(start_step) - 1, self.forward_ct)
            self.target_forward_ct = self.start_forward_ct + num_steps if num_steps else None
        else:
            self.target_forward_ct = self.forward_ct + num_steps if num_steps else None  # exactly num_steps forwards
            self._start()
        return "Succeeded"

    def _start(self, stage: Optional[ForwardMode] = None) -> None:
        acts = []
        if "CPU" in self.activities:
            acts.append(torch.profiler.ProfilerActivity.CPU)
        if "GPU" in self.activities and self.device.type == "cuda":
            acts.append(torch.profiler.ProfilerActivity.CUDA)
        if not acts:
            acts = [torch.profiler.ProfilerActivity.CPU]
        if self.device.type == "cuda":
            # the overlap loop may have a step in flight: let it finish outside the trace, so the
            # trace holds no kernel whose launch it did not see (stop() synchronises as well)
            torch.cuda.synchronize(self.device)
        self.torch_profiler = torch.profiler.profile(activities=acts, with_stack=self.with_stack,
                                                     record_shapes=self.record_shapes)
        self.torch_profiler.start()
        self.current_stage = stage
        self.in_progress = True
        log.info("Profiling starts%s. Traces will be saved to: %s (with profile id: %s)",
                 f" for {stage.name}" if stage else "", self.output_dir, self.profile_id)

    def _discard(self) -> None:
        if self.torch_profiler is not None and self.in_progress:
            self.torch_profiler.stop()
        self.torch_profiler = None
        self.in_progress = self.armed = False
        self.current_stage = self.start_forward_ct = None
        self.target_forward_ct = None

    def stop(self, stage: Optional[ForwardMode] = None) -> str:
        if not self.in_progress:
            raise ProfileError("Profiling is not in progress. Call /start_profile first.")
        self.output_dir.mkdir(parents=True, exist_ok=True)
        prefix = self.prefix + "-" if self.prefix else ""
        suffix = f"-{stage.name}" if stage else ""
        name = prefix + "-".join([self.profile_id, f"TP-{self.tp_rank}"]) + suffix + ".trace.json.gz"
        self.torch_profiler.stop()
        path = self.output_dir / name
        # write under a temporary name, then rename: a reader never sees a half-written trace name
        tmp = self.output_dir / (".tmp-" + name)
        self.torch_profiler.export_chrome_trace(str(tmp))
        os.replace(tmp, path)
        self.files.append(str(path))
        log.info("Profiling done. Traces are saved to: %s", path)
        self.torch_profiler = None
        gc.collect()
        self.in_progress = False
        self.current_stage = None
        self.target_forward_ct = None
        return "Succeeded."

    def stop_all(self) -> str:
        """/stop_profile: write what is being captured; disarm a by-stage profile not yet started."""
        if self.armed and not self.in_progress:
            self.armed = False
            return "Succeeded."
        self.armed = False
        return self.stop(self.current_stage if self.by_stage else None)

    # ------------------------------------------------------------------ per forward
    def before_forward(self, mode: ForwardMode) -> None:
        """SGLang's ``_profile_batch_predicate``: called before each batch runs."""
        if self.by_stage and self.armed:
            target = self.target_stage_ct
            if mode.is_extend():
                if self.in_progress and self.current_stage is ForwardMode.DECODE:
                    return  # a prefill inside the decode capture: it stays in the DECODE file
                if self.prefill_ct == 0 and not self.in_progress:
                    self._start(ForwardMode.EXTEND)
                self.prefill_ct += 1
                if target and self.prefill_ct > target and self.in_progress:
                    self.stop(ForwardMode.EXTEND)
            else:
                if self.decode_ct == 0:
                    if self.in_progress:  # force the prefill file out: it must not absorb decode steps
                        self.stop(ForwardMode.EXTEND)
                    self._start(ForwardMode.DECODE)
                self.decode_ct += 1
                if target and self.decode_ct > target and self.in_progress:
                    self.stop(ForwardMode.DECODE)
            if target and self.decode_ct > target and self.prefill_ct > 0 and not self.in_progress:
                self.armed = False  # both stage files written
            return
        if self.in_progress and self.target_forward_ct and self.target_forward_ct <= self.forward_ct:
            self.stop()
        if self.start_forward_ct is not None and self.forward_ct >= self.start_forward_ct and not self.in_progress:
            self.start_forward_ct = None
            self._start()

    def after_forward(self) -> None:
        # Like SGLang, steps are counted here and marked by the step[...] annotation; the torch
        # profiler's own step() is not called, so the trace has no ProfilerStep#N events.
        self.forward_ct += 1


class Scheduler:
    EOS_ID = 0

    def __init__(self, runner: ModelRunner, *, max_running_requests: int = 64, cuda_graph: bool = False,
                 cuda_graph_max_bs: int = 16, max_context: int = 8192, seed: int = 0,
                 overlap: Optional[bool] = None):
        self.runner = runner
        # SGLang's overlap scheduler: on by default on CUDA; on CPU it runs the same code path with
        # nothing to overlap (each op runs as it is called), which tests use to check the tokens
        self.overlap = runner.device.type == "cuda" if overlap is None else bool(overlap)
        self._inflight: Optional[_Launched] = None
        self._admitted: list[Req] = []
        self._last_done = 0.0
        self.max_running = max_running_requests
        self.waiting: "queue.Queue[Req]" = queue.Queue()
        self.control: "queue.Queue[tuple[str, dict, Future]]" = queue.Queue()
        self.running: list[Req] = []
        self.profiler = ProfilerManager(runner.device)
        self.graph_runner: Optional[CudaGraphRunner] = None
        if cuda_graph:
            if runner.device.type != "cuda":
                raise ValueError("--cuda-graph needs --device cuda")
            self.graph_runner = CudaGraphRunner(runner, cuda_graph_max_bs, max_context)
        self.gen = torch.Generator(device="cpu").manual_seed(seed)
        self.step_times: list[tuple[str, int, float]] = []  # (mode, bs, seconds), last 1000
        self._stop = threading.Event()
        self._wake = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="scheduler", daemon=True)
        self.error: Optional[BaseException] = None

    def start(self) -> None:
        self.thread.start()

    def shutdown(self) -> None:
        self._stop.set()
        self._wake.set()
        self.thread.join(timeout=10)

    # ------------------------------------------------------------------ API for HTTP threads
    def submit(self, req: Req) -> None:
        self.waiting.put(req)
        self._wake.set()

    def call(self, kind: str, payload: dict, timeout: float = 600.0):
        fut: Future = Future()
        self.control.put((kind, payload, fut))
        self._wake.set()
        return fut.result(timeout=timeout)

    # ------------------------------------------------------------------ loop
    def _process_control(self) -> None:
        while True:
            try:
                kind, payload, fut = self.control.get_nowait()
            except queue.Empty:
                return
            try:
                if kind == "start_profile":
                    fut.set_result(self.profiler.init(payload))
                elif kind == "stop_profile":
                    fut.set_result(self.profiler.stop_all())
                else:
                    fut.set_exception(ValueError(f"unknown control {kind}"))
            except BaseException as e:  # noqa: BLE001 - handed back to the HTTP thread
                fut.set_exception(e)

    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                self._process_control()
                if self.overlap:
                    self._overlap_iteration()
                    continue
                batch_new = self._admit()
                if batch_new:
                    self._run(ForwardMode.EXTEND, batch_new)
                elif self.running:
                    self._run(ForwardMode.DECODE, list(self.running))
                else:
                    self._wake.wait(0.05)
                    self._wake.clear()
        except BaseException as e:  # noqa: BLE001
            self.error = e
            log.exception("scheduler died")
            for r in self.running + self._admitted:
                r.out.put(("error", f"scheduler error: {e}"))

    def _admit(self) -> list[Req]:
        new: list[Req] = []
        while len(self.running) + len(new) < self.max_running:
            try:
                req = self.waiting.get_nowait()
            except queue.Empty:
                break
            slots = self.runner.allocator.alloc(len(req.input_ids) + req.max_new_tokens)
            if slots is None:
                req.out.put(("error", "KV pool is full (max_total_num_tokens too small for this request)"))
                continue
            req.slots = slots
            new.append(req)
        return new

    def _run(self, mode: ForwardMode, reqs: list[Req]) -> None:
        reqs = [r for r in reqs if not r.cancelled] or reqs
        if mode.is_extend():
            ids = [r.input_ids for r in reqs]
            ctx = [r.slots[: len(r.input_ids)] for r in reqs]
            new = ctx
            tag = f"step[EXTEND bs={len(reqs)} toks={sum(len(i) for i in ids)}]"
        else:
            ids = [[r.output_ids[-1]] for r in reqs]
            ctx = [r.slots[: len(r.input_ids) + len(r.output_ids)] for r in reqs]
            new = [[c[-1]] for c in ctx]
            tag = f"step[DECODE bs={len(reqs)}]"
        fb = self.runner.build_batch(mode, ids, ctx, new)
        self.profiler.before_forward(mode)
        t0 = time.perf_counter()
        with torch.profiler.record_function(tag):
            if self.graph_runner is not None and self.graph_runner.can_run(fb):
                logits = self.graph_runner.replay(fb)
            else:
                logits = self.runner.run_batch(fb)
            next_ids = self._sample(logits, reqs)
        if self.runner.device.type == "cuda":
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        self.profiler.after_forward()
        self.step_times.append((mode.name, len(reqs), dt))
        del self.step_times[:-1000]
        if mode.is_extend():
            self.running.extend(reqs)
        for r, t in zip(reqs, next_ids):
            r.output_ids.append(int(t))
            done = len(r.output_ids) >= r.max_new_tokens or (not r.ignore_eos and int(t) == self.EOS_ID)
            reason = None
            if done or r.cancelled:
                r.finished = True
                reason = "length" if len(r.output_ids) >= r.max_new_tokens else "stop"
            r.out.put(("token", (int(t), reason)))  # one message per token: the frame knows if it is the last
        finished = [r for r in self.running if r.finished]
        if finished:
            self.running = [r for r in self.running if not r.finished]
            for r in finished:
                self.runner.allocator.free(r.slots)

    def _sample(self, logits: torch.Tensor, reqs: list[Req]) -> list[int]:
        greedy = logits.argmax(-1).tolist()
        out = []
        for i, r in enumerate(reqs):
            if r.temperature and r.temperature > 0:
                p = torch.softmax(logits[i].float().cpu() / r.temperature, -1)
                out.append(int(torch.multinomial(p, 1, generator=self.gen)))
            else:
                out.append(int(greedy[i]))
        return out

    # ------------------------------------------------------------------ the overlap loop
    def _overlap_iteration(self) -> None:
        """Launch the next forward (if any), then read back and stream the previous one."""
        mode, reqs = self._next_batch()
        if reqs and self._inflight is not None and any(r.temperature and r.temperature > 0 for r in reqs):
            # sampled on the host: read the previous step first, as the normal loop would have
            self._resolve(self._inflight)
            self._inflight = None
            mode, reqs = self._next_batch()
        launched = self._launch(mode, reqs) if reqs else None
        if self._inflight is not None:
            self._resolve(self._inflight)
        self._inflight = None
        if launched is not None and launched.sync:
            self._resolve(launched)
            launched = None
        self._inflight = launched
        if launched is None and not self.running and not self._admitted:
            self._wake.wait(0.05)
            self._wake.clear()

    def _next_batch(self) -> tuple[ForwardMode, list[Req]]:
        if not self._admitted:
            self._admitted = self._admit()
        if self._admitted:
            return ForwardMode.EXTEND, self._admitted
        ready = []
        for r in list(self.running):
            if r.finished:
                continue
            if r.cancelled and r.inflight == 0:  # its client is gone: nothing more to compute
                self._finish(r, "stop", emit=False)
                continue
            if r.cancelled or r.launched >= r.max_new_tokens:
                continue  # its last token is in flight
            ready.append(r)
        return ForwardMode.DECODE, ready

    def _launch(self, mode: ForwardMode, reqs: list[Req]) -> _Launched:
        runner = self.runner
        cuda = runner.device.type == "cuda"
        for r in reqs:
            if r.slots_t is None:
                r.slots_t = torch.tensor(r.slots, dtype=torch.int32)
        if mode.is_extend():
            ids = [r.input_ids for r in reqs]
            ctx = [r.slots_t[: len(r.input_ids)] for r in reqs]
            new = [r.slots[: len(r.input_ids)] for r in reqs]
            tag = f"step[EXTEND bs={len(reqs)} toks={sum(len(i) for i in ids)}]"
        else:
            ids = self._device_input_ids(reqs)
            n = [len(r.input_ids) + r.launched for r in reqs]  # the context, the fed token's row included
            ctx = [r.slots_t[:k] for r, k in zip(reqs, n)]
            new = [[r.slots[k - 1]] for r, k in zip(reqs, n)]
            tag = f"step[DECODE bs={len(reqs)}]"
        sync = any(r.temperature and r.temperature > 0 for r in reqs)
        fb = runner.build_batch(mode, ids, ctx, new)
        self.profiler.before_forward(mode)
        t0 = time.perf_counter()
        ready = torch.cuda.Event() if cuda else None
        host_tokens = None
        with torch.profiler.record_function(tag):
            if self.graph_runner is not None and self.graph_runner.can_run(fb):
                logits = self.graph_runner.replay(fb, ready_event=ready)
            else:
                runner.attn_backend.init_forward_metadata(fb)
                if ready is not None:
                    ready.record()
                logits = runner.forward(fb)
            if sync:
                host_tokens = self._sample(logits, reqs)
                tokens = torch.tensor(host_tokens, dtype=torch.long, device=runner.device)
                host, done = tokens, None
            else:
                tokens = logits.argmax(-1)
                if cuda:
                    host = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=True)
                    host.copy_(tokens, non_blocking=True)
                    done = torch.cuda.Event()
                    done.record()
                else:
                    host, done = tokens, None
        self.profiler.after_forward()
        if self._inflight is not None and ready is not None:
            # the previous step's reader waits for this launch's copies to have run too: FlashInfer's
            # plan stages its work list in one page-locked buffer per wrapper, which the next plan
            # overwrites (the event fires right after the previous step, so it costs no time)
            self._inflight.ready = ready
        if mode.is_extend():
            self.running.extend(reqs)
            self._admitted = []
        for i, r in enumerate(reqs):
            r.launched += 1
            r.inflight += 1
            r.last_tok = (tokens, i)
        return _Launched(mode, list(reqs), tokens, host, done, t_launch=t0, sync=sync, host_tokens=host_tokens)

    def _device_input_ids(self, reqs: list[Req]) -> torch.Tensor:
        """Each request's latest sampled token, gathered on the device (one tensor as is when the
        batch is the previous step's, else one concatenation of slices: no host read-back)."""
        runs: list[list] = []  # [source tensor, first index, count]
        for r in reqs:
            src, i = r.last_tok
            if runs and runs[-1][0] is src and runs[-1][1] + runs[-1][2] == i:
                runs[-1][2] += 1
            else:
                runs.append([src, i, 1])
        if len(runs) == 1 and runs[0][1] == 0 and runs[0][2] == runs[0][0].numel():
            return runs[0][0]
        return torch.cat([src[i:i + k] for src, i, k in runs])

    def _resolve(self, job: _Launched) -> None:
        """Read a launched forward's tokens back (waiting for the GPU) and stream them."""
        if job.host_tokens is not None:
            toks = job.host_tokens
        else:
            ev = job.ready or job.done
            if ev is not None:
                ev.synchronize()
            toks = job.host.tolist()
        now = time.perf_counter()
        dt = now - max(job.t_launch, self._last_done)  # per-step period when steps run back to back
        self._last_done = now
        self.step_times.append((job.mode.name, len(job.reqs), dt))
        del self.step_times[:-1000]
        for r, t in zip(job.reqs, toks):
            r.inflight -= 1
            t = int(t)
            if r.finished:
                continue  # launched before its EOS was read: discarded
            r.output_ids.append(t)
            done = len(r.output_ids) >= r.max_new_tokens or (not r.ignore_eos and t == self.EOS_ID)
            if done or r.cancelled:
                reason = "length" if len(r.output_ids) >= r.max_new_tokens else "stop"
                r.out.put(("token", (t, reason)))
                self._finish(r, reason, emit=False)
            else:
                r.out.put(("token", (t, None)))

    def _finish(self, r: Req, reason: str, emit: bool = True) -> None:
        """Mark ``r`` finished, drop it from the running batch and free its pool rows. A step still
        in flight for it may write one of those rows; a later request given that row writes it in a
        later forward on the same stream, so the order holds."""
        r.finished = True
        self.running = [x for x in self.running if x is not r]
        self.runner.allocator.free(r.slots)
        if emit:
            r.out.put(("token", (r.output_ids[-1] if r.output_ids else self.EOS_ID, reason)))
