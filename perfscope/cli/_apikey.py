"""The server's API key, named by ``--api-key-env VAR``: read from the environment, never from the
command line (where ``ps`` and shell history would show it), never printed or stored."""

from __future__ import annotations

import os
from typing import Optional

import typer

from perfscope.errors import InputError, register_secret


def option():
    """The ``--api-key-env`` option, the same in every command that talks to the server."""
    return typer.Option(
        None,
        "--api-key-env",
        metavar="VAR",
        help="Environment variable holding the server's API key (sent as Bearer; never printed or stored).",
    )


def read(var: Optional[str]) -> Optional[str]:
    if not var:
        return None
    key = os.environ.get(var)
    if not key:
        raise InputError(f"--api-key-env {var}: that environment variable is not set or empty")
    register_secret(key)  # cut out of any message perfscope prints
    return key
