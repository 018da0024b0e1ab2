"""The one error type perfscope raises for anything a user can fix, and its exit codes.

Every command raises :class:`PerfscopeError` (or a subclass) with a one-line message; the CLI
entry point (`perfscope.cli.main`) maps it to ``exit_code`` and prints the message alone, never a
traceback. Exit codes are stable so that a CI job can gate on them:

    0  success
    1  the run worked and a gated finding was found (``--fail-on``), or a fix verification failed
    2  unusable input: missing/truncated/empty/non-Kineto trace, bad option, unknown version
    3  remote side: unreachable host, SSH auth refused, host key unknown or changed, server down
    4  a fix was refused (not applicable, unknown variant, file changed since the check)
  130  interrupted (Ctrl-C)
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FINDINGS = 1
EXIT_INPUT = 2
EXIT_REMOTE = 3
EXIT_FIX_REFUSED = 4
EXIT_INTERRUPTED = 130


class PerfscopeError(Exception):
    """A failure with a one-line, user-facing message."""

    exit_code = EXIT_INPUT

    def __init__(self, message: str, *, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:  # one line, always
        text = self.message if not self.hint else f"{self.message} ({self.hint})"
        return " ".join(text.split())


class InputError(PerfscopeError):
    """A file or option perfscope cannot use."""

    exit_code = EXIT_INPUT


class RemoteError(PerfscopeError):
    """The host, the SSH session or the inference server failed us."""

    exit_code = EXIT_REMOTE


class FixRefused(PerfscopeError):
    """A fix cannot (or must not) be applied here; nothing was changed."""

    exit_code = EXIT_FIX_REFUSED


class GateFailed(PerfscopeError):
    """The run worked, and what it found should fail a CI job."""

    exit_code = EXIT_FINDINGS
