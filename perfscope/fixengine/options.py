"""The options of a fix action, typed and checked once: :class:`RestartOptions` (``--restart-cmd`` and
its measurement) and :class:`FixOptions` (everything ``perfscope fix`` is given)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from perfscope.errors import InputError

STRATEGIES = ("auto", "native", "pages", "flags")
BASELINES = ("auto", "fresh", "current")


@dataclass
class BenchSpec:
    """The workload measured before and after (fixed prompts: the two runs compare)."""

    input_len: int = 256
    output_len: int = 128
    num_requests: int = 8  # one round; more rounds while the decision needs them
    warmup: int = 1
    concurrency: int = 1
    max_requests: int = 32  # per side, all rounds together


def check_restart_cmd(cmd: str) -> None:
    if not cmd.strip():
        raise InputError("--restart-cmd is empty")


def check_health_timeout(seconds: float) -> None:
    if seconds <= 0:
        raise InputError(f"--health-timeout {seconds:g}: expected seconds > 0")


def check_max_slowdown(fraction: float) -> None:
    if fraction < 0:
        raise InputError(f"--max-slowdown {fraction:g}: expected a fraction >= 0")


def check_baseline(baseline: str) -> None:
    if baseline not in BASELINES:
        raise InputError(f"--baseline {baseline!r}: expected auto, fresh or current")


@dataclass
class RestartOptions:
    """``--apply --restart-cmd CMD`` (and ``--revert --restart-cmd CMD``): how the server is restarted
    and measured; checked when made."""

    cmd: str
    health_timeout: float = 900.0  # seconds from starting CMD until /health answers (each restart)
    out: Optional[Path] = None  # the run folder (new or empty); None: perfscope-fix-<time>
    bench: BenchSpec = field(default_factory=BenchSpec)
    max_slowdown: float = 0.10
    baseline: str = "auto"  # fresh | current | auto: fresh when the fix was given a trace of this server

    def __post_init__(self) -> None:
        check_restart_cmd(self.cmd)
        check_health_timeout(self.health_timeout)
        check_max_slowdown(self.max_slowdown)
        check_baseline(self.baseline)

    @property
    def fresh_baseline(self) -> Optional[bool]:
        """Restart the unpatched server before measuring it (None: decide from the request's trace)."""
        return {"fresh": True, "current": False}.get(self.baseline)


@dataclass
class FixOptions:
    """What ``perfscope fix`` is given, one field per option (``cli/_fix_options.py`` declares them)."""

    fix_id: Optional[str] = None
    apply: bool = False
    revert: bool = False
    list_fixes: bool = False
    doc: bool = False
    strategy: str = "auto"
    target_file: Optional[str] = None
    launch_file: Optional[str] = None
    trace: Optional[Path] = None
    sglang_root: Optional[str] = None
    target: Optional[str] = None
    python: Optional[str] = None
    host: Optional[str] = None
    ssh_user: Optional[str] = None
    ssh_port: Optional[int] = None
    identity: Optional[Path] = None
    jump: Optional[str] = None
    known_hosts: Optional[Path] = None
    accept_new_host_key: bool = False
    url: Optional[str] = None
    api_key_env: Optional[str] = None
    port: Optional[int] = None
    kv_cache_dtype: Optional[str] = None
    attention_backend: Optional[str] = None
    gpu_cc: Optional[str] = None
    flashinfer_version: Optional[str] = None
    sglang_version: Optional[str] = None
    state_dir: Optional[str] = None
    expect_sha256: Optional[str] = None
    force: bool = False
    probe: bool = False
    restart_cmd: Optional[str] = None
    health_timeout: float = 900.0
    out: Optional[Path] = None
    bench_input_len: int = 256
    bench_output_len: int = 128
    bench_requests: int = 8
    bench_concurrency: int = 1
    budget: Optional[float] = None
    bench_max_requests: int = 32
    max_slowdown: float = 0.10
    baseline: str = "auto"
    json_out: bool = False

    @property
    def action(self) -> Optional[str]:
        """The option that changes the host ("--apply", "--revert"), None for a check."""
        return "--apply" if self.apply else "--revert" if self.revert else None

    def check(self) -> None:
        """The checks that need no fix module and no host, in the order a user meets them."""
        if not self.fix_id:
            raise InputError("give FIX_ID (see perfscope fix --list)")
        if self.apply and self.revert:
            raise InputError("--apply and --revert exclude each other")
        if self.strategy not in STRATEGIES:
            raise InputError(f"--strategy {self.strategy}: expected one of {', '.join(STRATEGIES)}")
        check_baseline(self.baseline)
        if self.restart_cmd is not None and not (self.apply or self.revert):
            raise InputError("--restart-cmd goes with --apply or --revert")
        if self.restart_cmd is not None:
            check_restart_cmd(self.restart_cmd)
        if self.out is not None and self.restart_cmd is None:
            raise InputError("--out goes with --restart-cmd (the run folder of the before/after measurement)")
        check_health_timeout(self.health_timeout)
        if self.target_file and self.sglang_root:
            raise InputError("give --target-file or --sglang-root, not both")
        check_max_slowdown(self.max_slowdown)
        if self.port is not None and not 0 <= self.port < 65536:
            raise InputError(f"--port {self.port}: expected 1-65535 (or 0: look for no server process)")

    def restart(self) -> Optional[RestartOptions]:
        """The restart's options, when ``--restart-cmd`` is given."""
        if self.restart_cmd is None:
            return None
        bench = BenchSpec(
            input_len=self.bench_input_len,
            output_len=self.bench_output_len,
            num_requests=self.bench_requests,
            concurrency=self.bench_concurrency,
            max_requests=max(self.bench_max_requests, self.bench_requests),
        )
        return RestartOptions(
            self.restart_cmd,
            health_timeout=self.health_timeout,
            out=self.out,
            bench=bench,
            max_slowdown=self.max_slowdown,
            baseline=self.baseline,
        )

    def overrides(self) -> dict[str, Optional[str]]:
        """Environment facts given as options (they win over what the host says)."""
        return {
            "kv_cache_dtype": self.kv_cache_dtype,
            "attention_backend": self.attention_backend,
            "compute_cap": self.gpu_cc,
            "flashinfer_version": self.flashinfer_version,
            "sglang_version": self.sglang_version,
        }
