"""The options of `perfscope fix`, in blocks, and the command signature typer reads from them: the
command itself receives them as one :class:`~perfscope.fixengine.options.FixOptions`."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, NamedTuple, Optional

import typer

from perfscope.cli import _apikey, _paths

if TYPE_CHECKING:
    from perfscope.fixengine.options import FixOptions


class Param(NamedTuple):
    name: str  # the FixOptions field it fills
    annotation: Any
    default: Any  # typer.Option / typer.Argument with its default


ACTION = [
    Param(
        "fix_id",
        Optional[str],
        typer.Argument(None, metavar="FIX_ID", help="Fix module id (see --list), e.g. fp8-kv-cast."),
    ),
    Param(
        "apply", bool, typer.Option(False, "--apply", help="Apply the patch (default: check and show the diff only).")
    ),
    Param("revert", bool, typer.Option(False, "--revert", help="Restore the original file byte for byte.")),
    Param("list_fixes", bool, typer.Option(False, "--list", help="List the fix modules.")),
    Param(
        "doc",
        bool,
        typer.Option(False, "--doc", help="With --list: print the generated Markdown document of every fix."),
    ),
    Param(
        "strategy",
        str,
        typer.Option("auto", "--strategy", help="auto; native or pages (fp8-kv-cast); flags (launch-flag fixes)."),
    ),
]

TARGET = [
    Param(
        "target_file",
        Optional[str],
        typer.Option(None, "--target-file", metavar="F", help="Patch this file (on the host)."),
    ),
    Param(
        "launch_file",
        Optional[str],
        typer.Option(
            None,
            "--launch-file",
            metavar="F",
            help="Launch-flag fixes: the server's launch command (on the host): a shell script, a systemd unit (ExecStart=) or a compose file (command:). Without it the change is printed, nothing is written.",
        ),
    ),
    Param(
        "trace",
        Optional[Path],
        typer.Option(
            None,
            "--trace",
            metavar="RUN",
            help="A trace or run folder (as given to diagnose): the fix reads its finding (batch sizes, step times) to pick its value and predict the step.",
        ),
    ),
    Param(
        "sglang_root",
        Optional[str],
        typer.Option(
            None, "--sglang-root", metavar="DIR", help="The sglang package folder (or the site-packages above it)."
        ),
    ),
    Param(
        "target",
        Optional[str],
        typer.Option(
            None, "--target", help="Which target of the fix (e.g. sglang-fa3); default from the attention backend."
        ),
    ),
    Param(
        "python",
        Optional[str],
        typer.Option(None, "--python", metavar="PY", help="The server's interpreter (default: the process on --port)."),
    ),
]

SSH = [
    Param(
        "host",
        Optional[str],
        typer.Option(None, "--host", "-H", metavar="[USER@]HOST[:SSHPORT]", help="The server's host, over SSH."),
    ),
    Param(
        "ssh_user",
        Optional[str],
        typer.Option(None, "--ssh-user", help="SSH user (default: from HOST, ~/.ssh/config, or you)."),
    ),
    Param("ssh_port", Optional[int], typer.Option(None, "--ssh-port", help="SSH port (default 22).")),
    Param("identity", Optional[Path], typer.Option(None, "--identity", "-i", help="Private key file.")),
    Param("jump", Optional[str], typer.Option(None, "--jump", "-J", help="Jump host(s), like ssh -J.")),
    Param(
        "known_hosts",
        Optional[Path],
        typer.Option(None, "--known-hosts", help="known_hosts file to check the host key against."),
    ),
    Param(
        "accept_new_host_key",
        bool,
        typer.Option(False, "--accept-new-host-key", help="Record an unknown host key (never a changed one)."),
    ),
]

SERVER = [
    Param(
        "url",
        Optional[str],
        typer.Option(None, "--url", help="Server URL reachable from here, for /server_info (local servers)."),
    ),
    Param("api_key_env", Optional[str], _apikey.option()),
    Param(
        "port",
        Optional[int],
        typer.Option(
            None,
            "--port",
            help="The server's HTTP port on the host (finds its process; SSH-forwarded). Default: the port recorded in --trace RUN's run.json, else 30000; 0: look for no server process.",
        ),
    ),
]

OVERRIDES = [  # facts of the host and server given as options: they win over what the host says
    Param(
        "kv_cache_dtype",
        Optional[str],
        typer.Option(None, "--kv-cache-dtype", help="Override: the server's kv_cache_dtype."),
    ),
    Param(
        "attention_backend",
        Optional[str],
        typer.Option(None, "--attention-backend", help="Override: flashinfer, fa3, ..."),
    ),
    Param(
        "gpu_cc",
        Optional[str],
        typer.Option(None, "--gpu-cc", metavar="X.Y", help="Override: the GPU's compute capability."),
    ),
    Param(
        "flashinfer_version",
        Optional[str],
        typer.Option(None, "--flashinfer-version", help="Override: FlashInfer version."),
    ),
    Param("sglang_version", Optional[str], typer.Option(None, "--sglang-version", help="Override: sglang version.")),
]

STATE = [
    Param(
        "state_dir",
        Optional[str],
        typer.Option(None, "--state-dir", help="Where backups and manifests go on the host."),
    ),
    Param(
        "expect_sha256",
        Optional[str],
        typer.Option(
            None, "--expect-sha256", help="Refuse unless the target still has this sha256 (from an earlier check)."
        ),
    ),
    Param("force", bool, typer.Option(False, "--force", help="--revert even if the file changed after the patch.")),
    Param(
        "probe",
        bool,
        typer.Option(
            False,
            "--probe",
            help="Run a tiny plan/run of the chosen kernel on the host's GPU first and compare with the cast path.",
        ),
    ),
]

RESTART = [  # --restart-cmd: restart, measure before and after, keep or revert
    Param(
        "restart_cmd",
        Optional[str],
        typer.Option(
            None,
            "--restart-cmd",
            metavar="CMD",
            help="After --apply: restart the server with CMD on the host, wait healthy, re-measure; revert if unhealthy. After --revert: restart it with CMD (the original takes effect) and wait healthy.",
        ),
    ),
    Param(
        "health_timeout",
        float,
        typer.Option(
            900.0,
            "--health-timeout",
            help="With --restart-cmd: seconds from starting CMD until /health must answer (each restart).",
        ),
    ),
    Param(
        "out",
        Optional[Path],
        _paths.out_option(
            "--out",
            "-o",
            help="With --restart-cmd: the run folder (new or empty) for before/after, restart.json, fix.json.",
        ),
    ),
    Param(
        "bench_input_len",
        int,
        typer.Option(256, "--bench-input-len", min=1, help="With --restart-cmd: prompt tokens per measured request."),
    ),
    Param(
        "bench_output_len",
        int,
        typer.Option(
            128, "--bench-output-len", min=2, help="With --restart-cmd: generated tokens per measured request."
        ),
    ),
    Param(
        "bench_requests",
        int,
        typer.Option(
            8,
            "--bench-requests",
            min=1,
            help="With --restart-cmd: measured requests per round (after 1 warm-up); rounds go on while the keep-or-revert decision needs them.",
        ),
    ),
    Param(
        "bench_concurrency",
        int,
        typer.Option(
            1,
            "--bench-concurrency",
            min=1,
            help="With --restart-cmd: requests in flight while measuring (a fix whose gain grows with the batch, such as untuned-fused-moe, is measured at the served concurrency).",
        ),
    ),
    Param(
        "budget",
        Optional[float],
        typer.Option(
            None,
            "--budget",
            metavar="SECONDS",
            help="Fixes that spend GPU time on the server (untuned-fused-moe's tuning): its bound in seconds (default: the fix's own, shown by the check).",
        ),
    ),
    Param(
        "bench_max_requests",
        int,
        typer.Option(
            32,
            "--bench-max-requests",
            min=1,
            help="With --restart-cmd: at most this many measured requests per side; the change still undecided then: exit 1, the patch stays applied.",
        ),
    ),
    Param(
        "max_slowdown",
        float,
        typer.Option(
            0.10,
            "--max-slowdown",
            metavar="FRAC",
            help="With --restart-cmd: revert (and restart again) when TPOT after is more than this fraction slower than before.",
        ),
    ),
    Param(
        "baseline",
        str,
        typer.Option(
            "auto",
            "--baseline",
            metavar="auto|fresh|current",
            help="With --restart-cmd: 'fresh' restarts the unpatched server before measuring it, so that before and after are both fresh processes; 'current' measures the running one; 'auto' (default): fresh with --trace, whose profile left CUPTI attached to the traced process and slowed it.",
        ),
    ),
]

OUTPUT = [
    Param("json_out", bool, typer.Option(False, "--json", help="Print the result as JSON.")),
]

PARAMS = ACTION + TARGET + SSH + SERVER + OVERRIDES + STATE + RESTART + OUTPUT


def with_options(params: list[Param]) -> Callable[[Callable[[FixOptions], int]], Callable[..., int]]:
    """A typer command whose parameters are ``params``, calling ``fn`` with them as one FixOptions."""

    def wrap(fn: Callable[[FixOptions], int]) -> Callable[..., int]:
        def command(**given: Any) -> int:
            from perfscope.fixengine.options import FixOptions  # the engine loads when a fix command runs

            return fn(FixOptions(**given))

        sig = inspect.Signature(
            [
                inspect.Parameter(p.name, inspect.Parameter.KEYWORD_ONLY, default=p.default, annotation=p.annotation)
                for p in params
            ],
            return_annotation=int,
        )
        command.__signature__ = sig  # type: ignore[attr-defined]  # typer reads the options from it
        command.__annotations__ = {p.name: p.annotation for p in params} | {"return": int}
        command.__doc__, command.__name__, command.__module__ = fn.__doc__, fn.__name__, fn.__module__
        return command

    return wrap
