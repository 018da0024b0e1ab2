"""The `perfscope` command line: one thin module per command in this package.

Each module ``perfscope/cli/<name>.py`` exposes ``NAME`` (the command), ``ORDER`` (its place in
``--help``) and ``command`` (a typer-style function). This file finds them, builds the app and maps
:class:`perfscope.errors.PerfscopeError` to its exit code in one place.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys

import typer
from rich.console import Console
from rich.markup import escape

from perfscope import __version__
from perfscope.errors import EXIT_INTERRUPTED, PerfscopeError

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
)


def _version(value: bool) -> None:
    if value:
        print(f"perfscope {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    """perfscope"""


def _register() -> None:
    mods = []
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("_"):
            continue
        mod = importlib.import_module(f"{__name__}.{info.name}")
        if hasattr(mod, "command") and hasattr(mod, "NAME"):
            mods.append(mod)
    from perfscope.cli import _help

    for mod in sorted(mods, key=lambda m: (getattr(m, "ORDER", 100), m.NAME)):
        # help that teaches: the module's EXAMPLES end its --help; HELP_CLASS for help of its own
        cls = _help.command_class(getattr(mod, "EXAMPLES", ()), getattr(mod, "HELP_CLASS", _help.Command))
        app.command(mod.NAME, help=mod.command.__doc__, cls=cls)(mod.command)


_register()

err_console = Console(stderr=True, highlight=False, soft_wrap=True)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: run a command, turn errors into one line and an exit code.

    Usage errors are typer's (exit 2); a PerfscopeError prints one line and exits with its code;
    a command that wants another code raises ``typer.Exit(code)``.
    """
    try:
        app(args=argv, prog_name="perfscope", standalone_mode=True)
    except PerfscopeError as e:
        err_console.print(f"[bold red]perfscope: error:[/] {escape(str(e))}", markup=True, highlight=False)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        err_console.print("perfscope: interrupted")
        sys.exit(EXIT_INTERRUPTED)
    except BrokenPipeError:
        sys.exit(0)
