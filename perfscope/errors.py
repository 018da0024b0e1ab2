"""The one error type perfscope raises for anything a user can fix, and its exit codes.

Every command raises :class:`PerfscopeError` (or a subclass) with a one-line message; the CLI
entry point (`perfscope.cli.main`) maps it to ``exit_code`` and prints the message alone, never a
traceback. Exit codes are stable so that a CI job can gate on them:

    0  success
    1  the run worked and a gated finding was found (``--fail-on``), or a fix verification failed
    2  unusable input: missing/truncated/empty/non-Kineto trace, bad option, unknown version
    3  remote side: unreachable host, SSH auth refused, host key unknown or changed, server down
    4  a fix was refused or does not apply here (skipped: e.g. no FP8 KV cache; unknown variant,
       file changed since the check); a --revert with nothing to revert is 0
   70  internal error: a bug in perfscope (``PERFSCOPE_DEBUG=1`` prints its traceback)
  130  interrupted by SIGINT (Ctrl-C); 143 by SIGTERM, 129 by SIGHUP (128 + the signal number).
       The profiler is stopped, child processes are killed, and the run folder says it is incomplete.

Secrets perfscope knows (the server's API key) are registered with :func:`register_secret` and
cut out of every error message (:func:`redact`), including server replies that echo headers.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FINDINGS = 1
EXIT_INPUT = 2
EXIT_REMOTE = 3
EXIT_FIX_REFUSED = 4
EXIT_INTERNAL = 70
EXIT_INTERRUPTED = 130

_SECRETS: set[str] = set()


def register_secret(value: str | None) -> None:
    """Remember a secret (an API key) so that no message perfscope prints can contain it."""
    if value and len(value) >= 4:
        _SECRETS.add(value)


def redact(text: str) -> str:
    """``text`` with every registered secret replaced by ``***``."""
    for s in sorted(_SECRETS, key=len, reverse=True):
        if s in text:
            text = text.replace(s, "***")
    return text


class Interrupted(KeyboardInterrupt):
    """SIGINT, SIGTERM or SIGHUP arrived: unwinds like Ctrl-C (every ``finally`` runs, so the
    profiler is stopped); the CLI exits 128 + ``signum``."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


class PerfscopeError(Exception):
    """A failure with a one-line, user-facing message."""

    exit_code = EXIT_INPUT

    def __init__(self, message: str, *, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:  # one line, always
        text = self.message if not self.hint else f"{self.message} ({self.hint})"
        return redact(" ".join(text.split()))


class InputError(PerfscopeError):
    """A file or option perfscope cannot use."""

    exit_code = EXIT_INPUT


class RemoteError(PerfscopeError):
    """The host, the SSH session or the inference server failed us."""

    exit_code = EXIT_REMOTE


class StreamStall(RemoteError):
    """The server sent nothing for the per-line (or per-reply) time limit: it stalled, it did not refuse.
    An engine stalls so while it writes its profile (vLLM's worker: tens of seconds to minutes on a
    loaded CPU host); ``perfscope trace``'s load tolerates it after the profile's steps."""


class FixRefused(PerfscopeError):
    """A fix cannot (or must not) be applied here; nothing was changed."""

    exit_code = EXIT_FIX_REFUSED


class GateFailed(PerfscopeError):
    """The run worked, and what it found should fail a CI job."""

    exit_code = EXIT_FINDINGS
