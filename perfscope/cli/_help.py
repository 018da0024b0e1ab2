"""`--help` that teaches: every command's help ends with its real examples (the module's
``EXAMPLES``), flags show as flags (no ``<bool>``), values by what they are (``N``, ``SECONDS``,
``PATH``, ``STRATEGY``) rather than ``<str>``; ``perfscope fix FIX_ID --help`` shows that fix
module's own document (generic over the fix registry: every module in fixes/ gets it)."""

from __future__ import annotations

import inspect

from typing import TYPE_CHECKING, Callable, Optional, Sequence

from typer.core import TyperCommand, TyperGroup

from perfscope.cli import _coerce

if TYPE_CHECKING:  # rich loads when help is drawn: a command that runs never needs it for this
    from rich.console import Console, RenderableType
    from rich.panel import Panel
    from rich.text import Text


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


def _shell_words(cmd: str) -> list[str]:
    """``cmd`` split at the spaces a shell splits it at (a quoted argument is one word, its quotes kept)."""
    words, cur, quote = [], "", ""
    for ch in cmd:
        if quote:
            cur += ch
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            cur, quote = cur + ch, ch
        elif ch == " ":
            if cur:
                words.append(cur)
            cur = ""
        else:
            cur += ch
    return words + ([cur] if cur else [])


def shell_lines(cmd: str, width: int, indent: int = 4) -> list[str]:
    """``cmd`` in lines of at most ``width`` columns that paste back as the same command: broken
    only between shell words, each broken line ending in `` \\`` and the next indented (a word
    longer than the line is left whole)."""
    lines, cur = [], ""
    for w in _shell_words(cmd):
        if cur and len(cur) + 1 + len(w) + 2 > width:
            lines.append(cur + " \\")
            cur = " " * indent + w
        else:
            cur = f"{cur} {w}" if cur else w
    return lines + [cur]


def examples_panel(examples: Sequence[tuple[str, str]], width: Optional[int] = None) -> Panel:
    """The examples, each command on lines that paste back into a shell (never folded mid-word at
    the panel's edge: broken between words with `` \\``), its description indented under it."""
    from rich.console import Group
    from rich.padding import Padding
    from rich.panel import Panel
    from rich.text import Text

    width = width or _console().width
    rows: list[RenderableType] = []
    for cmd, what in examples:
        for i, line in enumerate(shell_lines(cmd, width - 6)):
            rows.append(
                Text.assemble(("$ " if i == 0 else "  ", "dim"), (line, "bold"), no_wrap=True, overflow="ignore")
            )
        if what:
            rows.append(Padding(Text(what, style="dim"), (0, 0, 0, 2)))
    return Panel(Group(*rows), title="Examples", title_align="left", border_style="dim")


def _console() -> Console:
    from typer import rich_utils

    return rich_utils._get_rich_console()


# typer's rich_utils functions replaced below, by name: the replacement (each is replaced once)
_INSTALLED: dict[str, Callable] = {}


def _fold_option_help() -> None:
    """An option's help that holds a word longer than its column (a URL, a path) folds onto the next
    line instead of being cut with an ellipsis (rich's table default): the help column of typer's
    option table is narrow on an 80-column screen."""
    from typer import rich_utils

    inner = rich_utils._get_parameter_help
    if inner is _INSTALLED.get("_get_parameter_help"):
        return

    def folded(*args, **kwargs):
        cell = inner(*args, **kwargs)  # rich Columns of Text (help, default, required)
        for item in getattr(cell, "renderables", None) or [cell]:
            if hasattr(item, "overflow"):
                item.overflow = "fold"
        return cell

    _INSTALLED["_get_parameter_help"] = folded
    rich_utils._get_parameter_help = folded


def _stack_narrow_options() -> None:
    """On a narrow screen (80 columns, or piped: rich's default) typer's option table leaves its help
    column ~25 characters wide: option names were cut with an ellipsis (--accept-new-hos…), value
    names and the URLs / paths / flags an option's help names were folded mid-token
    (http://127.0.0.1: / 30000). There each option is drawn as a block instead: its names and value
    name on a line of their own, never cut or folded, its help below, indented, wrapped at spaces
    over the whole width. A wide screen keeps typer's table."""
    from rich.console import Group
    from rich.padding import Padding
    from rich.panel import Panel
    from rich.text import Text
    from typer import rich_utils

    inner = rich_utils._print_options_panel
    if inner is _INSTALLED.get("_print_options_panel"):
        return

    def head(param, ctx) -> Text:
        if getattr(param, "param_type_name", "") == "argument":
            names = [param.display_name_raw + ("..." if param.metavar is None and param.nargs != 1 else "")]
        else:
            longs = [o for o in param.opts if o.startswith("--")]
            names = longs + [o for o in param.opts if not o.startswith("--")] + list(param.secondary_opts)
        value = param.display_type_rich(ctx=ctx) if getattr(param, "param_type_name", "") != "argument" else None
        text = ("* " if param.required else "") + ", ".join(names) + (f" {value}" if value else "")
        return rich_utils.highlighter(Text(text, no_wrap=True, overflow="ignore"))

    def panel(*, name, params, ctx, markup_mode, console) -> None:
        heads = [head(p, ctx) for p in params]
        if not params or console.width - _table_left(params, ctx) >= STACK_BELOW_HELP_WIDTH:
            return inner(name=name, params=params, ctx=ctx, markup_mode=markup_mode, console=console)
        rows: list[RenderableType] = []
        for h, p in zip(heads, params):
            rows.append(h)
            rows.append(
                Padding(rich_utils._get_parameter_help(param=p, ctx=ctx, markup_mode=markup_mode), (0, 0, 0, 4))
            )
        console.print(
            Panel(
                Group(*rows),
                border_style=rich_utils.STYLE_OPTIONS_PANEL_BORDER,
                title=name,
                title_align=rich_utils.ALIGN_OPTIONS_PANEL,
            )
        )

    def _table_left(params, ctx) -> int:
        """Columns typer's table gives everything left of the help (long names, short names, the
        negative flag, the value name; each padded) plus the panel's borders."""
        cols = [0, 0, 0, 0]
        for p in params:
            arg = getattr(p, "param_type_name", "") == "argument"
            cells = (
                ",".join(o for o in p.opts if o.startswith("--")),
                p.display_name_raw if arg else ",".join(o for o in p.opts if not o.startswith("--")),
                ",".join(p.secondary_opts),
                "" if arg else str(p.display_type_rich(ctx=ctx) or ""),
            )
            cols = [max(c, len(x)) for c, x in zip(cols, cells)]
        return sum(c + 2 for c in cols) + 8

    _INSTALLED["_print_options_panel"] = panel
    rich_utils._print_options_panel = panel


# typer's table is kept while its help column is at least this wide
STACK_BELOW_HELP_WIDTH = 50


class Command(TyperCommand):
    """A perfscope command: its help ends with ``examples`` (set per command by :func:`command_class`)."""

    examples: Sequence[tuple[str, str]] = ()

    def get_params(self, ctx):
        return _coerce.install(super().get_params(ctx))  # values coerced without pydantic where plain

    def format_help(self, ctx, formatter) -> None:
        _flags_as_flags(self, ctx)
        _fold_option_help()
        _stack_narrow_options()
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

    def get_params(self, ctx):
        return _coerce.install(super().get_params(ctx))

    def format_help(self, ctx, formatter) -> None:
        _flags_as_flags(self, ctx)
        _stack_narrow_options()
        super().format_help(ctx, formatter)


def command_class(examples: Sequence[tuple[str, str]], base: type = Command) -> type:
    return type(f"{base.__name__}WithExamples", (base,), {"examples": tuple(examples)})


def _text(s: str) -> Text:
    from rich.text import Text

    return Text(s)


class SubjectHelpCommand(Command):
    """A command whose first argument names a subject with help of its own (``perfscope fix
    fp8-kv-cast --help``): ``subjects()`` lists the names, ``subject_help(name)`` renders one and
    ``subject_examples(name)`` gives its examples."""

    subjects: Callable[[], Sequence[str]] = staticmethod(lambda: ())
    subject_help: Callable[[str], object] = staticmethod(lambda name: _text(name))
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
        from rich.text import Text

        name: Optional[str] = ctx.meta.get("perfscope_help_subject")
        if not name:
            return super().format_help(ctx, formatter)
        c = _console()
        c.print(self.subject_help(name))
        ex = self.subject_examples(name)
        if ex:
            c.print(examples_panel(ex))
        c.print(Text(f"Every option: perfscope {ctx.info_name} --help", style="dim"))
