"""`--help` that teaches: every command's help ends with its real examples (the module's
``EXAMPLES``), flags show as flags (no ``<bool>``), values by what they are (``N``, ``SECONDS``,
``PATH``, ``STRATEGY``) rather than ``<str>``; ``perfscope fix FIX_ID --help`` shows that fix
module's own document (generic over the fix registry: every module in fixes/ gets it)."""

from __future__ import annotations

import inspect

from typing import Callable, Optional, Sequence

from rich.console import Console, Group
from rich.markup import escape
from rich.panel import Panel
from rich.text import Text
from typer.core import TyperCommand, TyperGroup


def _value_name(p) -> str:
    name = (p.name or "value").lower().rstrip("_")
    try:
        tname = p.bare_type() if hasattr(p, "bare_type") else getattr(p.type, "name", "")
    except Exception:
        tname = ""
    tname = str(tname).lower()
    if tname.startswith("list[") and tname.endswith("]"):
        tname = tname[5:-1]
    if tname in ("int", "integer"):
        return "N"
    if tname == "float":
        return "SECONDS" if "timeout" in name else "X"
    if "path" in tname:
        return "PATH"
    return name.upper()


def teach_params(cmd) -> None:
    """Flags as flags (an empty metavar: typer >= 0.2x shows ``<bool>``), other values named."""
    for p in cmd.params:
        if getattr(p, "param_type_name", "") == "argument":
            p.display_type_rich = lambda ctx=None: None  # its name (FIX_ID, PATHS...) says what it is
            continue
        if getattr(p, "param_type_name", "") != "option":
            continue
        if getattr(p, "is_flag", False) or getattr(p, "count", False):
            p.metavar = ""
        elif p.metavar is None:
            p.metavar = _value_name(p)


def unwrap(doc: Optional[str]) -> str:
    """A docstring as help prose: the source's hard line breaks inside a paragraph joined, so the
    terminal wraps it at its own width (typer >= 0.2x keeps them, which leaves a fragment on every
    line of an 80-column screen). Indented blocks (examples, lists) keep their lines."""
    if not doc:
        return doc or ""
    out = []
    for para in inspect.cleandoc(doc).split("\n\n"):
        lines = para.splitlines()
        if any(ln[:1] in (" ", "\t") or ln[:2] in ("- ", "* ", "$ ") or ln.startswith("\b") for ln in lines):
            out.append(para)
        else:
            out.append(" ".join(ln.strip() for ln in lines))
    return "\n\n".join(out)


def examples_panel(examples: Sequence[tuple[str, str]]) -> Panel:
    rows = []
    for cmd, what in examples:
        rows.append(Text.assemble(("$ ", "dim"), (cmd, "bold")))
        if what:
            rows.append(Text(f"  {what}", style="dim"))
    return Panel(Group(*rows), title="Examples", title_align="left", border_style="dim")


def _console() -> Console:
    from typer import rich_utils

    return rich_utils._get_rich_console()


def _fold_option_help() -> None:
    """An option's help that holds a word longer than its column (a URL, a path) folds onto the next
    line instead of being cut with an ellipsis (rich's table default): the help column of typer's
    option table is narrow on an 80-column screen."""
    from typer import rich_utils

    inner = rich_utils._get_parameter_help
    if getattr(inner, "_folds", False):
        return

    def folded(*args, **kwargs):
        cell = inner(*args, **kwargs)  # rich Columns of Text (help, default, required)
        for item in getattr(cell, "renderables", None) or [cell]:
            if hasattr(item, "overflow"):
                item.overflow = "fold"
        return cell

    folded._folds = True
    rich_utils._get_parameter_help = folded


class Command(TyperCommand):
    """A perfscope command: its help ends with ``examples`` (set per command by :func:`command_class`)."""

    examples: Sequence[tuple[str, str]] = ()

    def format_help(self, ctx, formatter) -> None:
        _flags_as_flags(self, ctx)
        _fold_option_help()
        super().format_help(ctx, formatter)
        if self.examples:
            _console().print(examples_panel(self.examples))


def _flags_as_flags(cmd, ctx) -> None:
    """Before a command's help is drawn: its options taught (:func:`teach_params`), --help shown bare."""
    teach_params(cmd)
    ho = cmd.get_help_option(ctx)
    if ho is not None:
        ho.metavar = ""


class RootGroup(TyperGroup):
    """The ``perfscope`` group: its own options (--version, --help) show as flags too."""

    def format_help(self, ctx, formatter) -> None:
        _flags_as_flags(self, ctx)
        super().format_help(ctx, formatter)


def command_class(examples: Sequence[tuple[str, str]], base: type = Command) -> type:
    return type(f"{base.__name__}WithExamples", (base,), {"examples": tuple(examples)})


class SubjectHelpCommand(Command):
    """A command whose first argument names a subject with help of its own (``perfscope fix
    fp8-kv-cast --help``): ``subjects()`` lists the names, ``subject_help(name)`` renders one and
    ``subject_examples(name)`` gives its examples."""

    subjects: Callable[[], Sequence[str]] = staticmethod(lambda: ())
    subject_help: Callable[[str], object] = staticmethod(lambda name: Text(name))
    subject_examples: Callable[[str], Sequence[tuple[str, str]]] = staticmethod(lambda name: ())

    def parse_args(self, ctx, args):
        if any(a in ("--help", "-h") for a in args):
            try:
                names = set(self.subjects())
            except Exception:  # a broken module must not break --help
                names = set()
            hit = next((a for a in args if a in names), None)
            if hit:
                ctx.meta["perfscope_help_subject"] = hit
        return super().parse_args(ctx, args)

    def format_help(self, ctx, formatter) -> None:
        name: Optional[str] = ctx.meta.get("perfscope_help_subject")
        if not name:
            return super().format_help(ctx, formatter)
        c = _console()
        c.print(self.subject_help(name))
        ex = self.subject_examples(name)
        if ex:
            c.print(examples_panel(ex))
        c.print(Text(f"Every option: perfscope {ctx.info_name} --help", style="dim"))
