"""The `perfscope` command line: one thin module per command in this package.

Each module ``perfscope/cli/<name>.py`` exposes ``NAME`` (the command), ``ORDER`` (its place in
``--help``) and ``command`` (a typer-style function). This file finds them, builds the app (with the
one command a command line names, every command for the root's help and errors) and maps
:class:`perfscope.errors.PerfscopeError` to its exit code in one place.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import traceback

import typer
from typer import _click as click  # typer vendors click: its exceptions and EPIPE wrapper

from perfscope import __version__
from perfscope.cli import _help
from perfscope.errors import EXIT_INPUT, EXIT_INTERNAL, EXIT_INTERRUPTED, Interrupted, PerfscopeError, redact


def _new_app() -> typer.Typer:
    """The ``perfscope`` app, no command registered yet."""
    app = typer.Typer(
        name="perfscope",
        help=(
            "Find and fix decode bottlenecks in live LLM inference servers.\n\n"
            "trace: profile a server over SSH  ->  diagnose: where each decode step's time goes  ->  "
            "fix: patch the bottleneck safely  ->  bench / compare: prove it."
        ),
        epilog=(
            "Examples: [bold]perfscope demo[/] (the whole loop on this machine, on CPU)\n\n"
            "[bold]perfscope trace --host gpu-box --out run1[/]  then  [bold]perfscope diagnose run1[/]\n\n"
            "Every command's --help ends with examples; perfscope fix FIX_ID --help shows that fix's document."
        ),
        no_args_is_help=True,
        add_completion=False,
        rich_markup_mode="rich",
        pretty_exceptions_enable=False,
        cls=_help.RootGroup,
    )
    app.callback()(_root)
    return app


def _version(value: bool) -> None:
    if value:
        print(f"perfscope {__version__}")
        raise typer.Exit()


def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    """perfscope"""


def _command_modules(word: str | None = None) -> list:
    """The command modules in ``--help`` order: all of them, or (``word`` naming one, as the first
    word of a command line does) that one alone, so a run imports and builds only the command it
    runs. An empty list when ``word`` names no command module."""
    import importlib.util
    import pkgutil

    if word is not None:
        if not word.isidentifier() or word.startswith("_") or importlib.util.find_spec(f"{__name__}.{word}") is None:
            return []
        found = [importlib.import_module(f"{__name__}.{word}")]
    else:
        found = [
            importlib.import_module(f"{__name__}.{info.name}")
            for info in pkgutil.iter_modules(__path__)
            if not info.name.startswith("_")
        ]
    mods = [m for m in found if hasattr(m, "command") and hasattr(m, "NAME") and (word is None or m.NAME == word)]
    return sorted(mods, key=lambda m: (getattr(m, "ORDER", 100), m.NAME))


def _build(mods: list) -> typer.Typer:
    app = _new_app()
    for mod in mods:
        # help that teaches: the module's EXAMPLES end its --help; HELP_CLASS for help of its own
        cls = _help.command_class(getattr(mod, "EXAMPLES", ()), getattr(mod, "HELP_CLASS", _help.Command))
        app.command(mod.NAME, help=_help.unwrap(mod.command.__doc__), cls=cls)(mod.command)
    return app


def _app_for(argv: list[str]) -> typer.Typer:
    """The app that runs ``argv``: with only the command it names when its first word names one
    (``perfscope diagnose ...``), every command otherwise (``--help``, ``--version``, no command or an
    unknown one: the root's help and errors list them all)."""
    word = argv[0] if argv else None
    mods = _command_modules(word) if word and not word.startswith("-") else []
    return _build(mods) if mods else __getattr__("app")


_FULL: list[typer.Typer] = []  # the app with every command, built once


def __getattr__(name: str) -> typer.Typer:
    if name == "app":  # the whole app, every command registered (the tests walk it)
        if not _FULL:
            _FULL.append(_build(_command_modules()))
        return _FULL[0]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP")
_Abort: type[BaseException] = getattr(click.exceptions, "Abort", getattr(typer, "Abort", KeyboardInterrupt))
_INTERNAL = "internal error, run with PERFSCOPE_DEBUG=1 for the traceback"


def _debug() -> bool:
    return os.environ.get("PERFSCOPE_DEBUG", "") not in ("", "0")


def _quiet_paramiko() -> None:
    """paramiko logs handshake failures with tracebacks; perfscope says them in one line itself."""
    lg = logging.getLogger("paramiko")
    lg.addHandler(logging.NullHandler())
    lg.propagate = False
    if not _debug():
        lg.setLevel(logging.CRITICAL + 1)


class _Signals:
    """SIGINT, SIGTERM and SIGHUP raise :class:`Interrupted` in the main thread, once: every
    ``finally`` then runs (profiler stopped, children killed, host folder removed). A second signal
    while that cleanup runs is noted, not raised, so the cleanup itself is not cut short."""

    def __init__(self):
        self.got: int | None = None
        self.old: dict[int, object] = {}

    def _handler(self, signum, frame):
        if self.got is not None:
            return
        self.got = signum
        if signum == signal.SIGINT:
            raise KeyboardInterrupt  # what Ctrl-C always raised (records name it so)
        raise Interrupted(signum)

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for name in _SIGNALS:
                sig = getattr(signal, name, None)
                if sig is not None:
                    with contextlib.suppress(OSError, ValueError):
                        self.old[sig] = signal.signal(sig, self._handler)
        return self

    def __exit__(self, *exc):
        for sig, old in self.old.items():
            with contextlib.suppress(OSError, ValueError, TypeError):
                signal.signal(sig, old)


def _err_console():
    """stderr as rich writes to it (imported here: a command that succeeds never loads rich for it)."""
    from perfscope.report.escape import Console

    return Console(stderr=True, highlight=False, soft_wrap=True)


def _say(text: str) -> None:
    from perfscope.report.escape import markup as escape

    with contextlib.suppress(Exception):
        _err_console().print(escape(redact(text)), markup=True, highlight=False)


def _error(text: str) -> None:
    from perfscope.report.escape import markup as escape

    with contextlib.suppress(Exception):
        _err_console().print(f"[bold red]perfscope: error:[/] {escape(redact(text))}", markup=True, highlight=False)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: run a command, turn every outcome into one line and an exit code.

    The one error path: usage errors are click's (exit 2); a PerfscopeError prints one line and
    exits with its code; SIGINT/SIGTERM/SIGHUP print "perfscope: interrupted" and exit 128+signal
    (130, 143, 129); a broken pipe (``| head``) exits 0 quietly; an OSError (disk full, read-only
    file system, permission denied) is one line and exit 2; anything else is a bug: one line,
    exit 70, and its traceback only with ``PERFSCOPE_DEBUG=1``. A command that wants another code
    raises ``typer.Exit(code)``.
    """
    _quiet_paramiko()
    code = 0
    with _Signals() as sigs:
        try:
            rv = _app_for(sys.argv[1:] if argv is None else argv)(
                args=argv, prog_name="perfscope", standalone_mode=False
            )
            code = rv if isinstance(rv, int) else 0
        except PerfscopeError as e:
            if _debug():
                traceback.print_exc()
            _error(str(e))
            code = e.exit_code
        except click.exceptions.ClickException as e:
            from typer import rich_utils

            rich_utils.rich_format_error(e)
            code = e.exit_code
        except (KeyboardInterrupt, _Abort) as e:
            sig = getattr(e, "signum", None) or sigs.got or signal.SIGINT
            sigs.got = sigs.got or sig
            code = 128 + int(sig)
        except SystemExit as e:
            if isinstance(sys.stdout, click.utils.PacifyFlushWrapper):  # click's EPIPE path
                code = 0
            else:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BrokenPipeError:
            code = 0
        except OSError as e:  # the file system said no (disk full, read-only, permissions): the user's to fix
            if _debug():
                traceback.print_exc()
            where = f"{e.filename}: " if e.filename else ""
            _error(f"{where}{e.strerror or e}")
            code = EXIT_INPUT
        except RecursionError:
            if _debug():
                traceback.print_exc()
            _error("input nested too deeply to read (more than Python's recursion limit)")
            code = EXIT_INPUT
        except Exception:
            if _debug():
                traceback.print_exc()
            _error(_INTERNAL)
            code = EXIT_INTERNAL
        if sigs.got is not None and code == EXIT_INTERRUPTED or (sigs.got is not None and code == 128 + sigs.got):
            code = 128 + int(sigs.got)
            _say("perfscope: interrupted")
        elif code == EXIT_INTERRUPTED:  # typer turned a KeyboardInterrupt into Exit(130)
            _say("perfscope: interrupted")
    if isinstance(sys.stdout, click.utils.PacifyFlushWrapper):
        code = 0 if code in (1, EXIT_INTERNAL) else code
    sys.stdout.flush() if not sys.stdout.closed else None
    sys.exit(code)
