"""Output paths of the commands that write: one typer option factory, resolved in one place
(:func:`perfscope.util.files.user_path`: ``~`` expanded, made absolute against the working
directory) before any command code sees them."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from perfscope.util.files import user_path


def resolve(value: Optional[Path]) -> Optional[Path]:
    return None if value is None else user_path(value)


def out_option(*names: str, help: str, metavar: Optional[str] = None):
    """``typer.Option(None, *names)`` whose value arrives as an absolute path (or None)."""
    return typer.Option(None, *names, help=help, metavar=metavar, callback=resolve)
