"""A command's option values coerced without pydantic where the answer is plain: typer (>= 0.2x)
coerces every parameter of the command it runs through a pydantic ``TypeAdapter`` it builds on
the spot, ~0.1 s of importing pydantic and building adapters on every run, longer than perfscope
takes to diagnose a small trace. Here a parameter whose value is ``None``, a default of its own
type, a path, a plain decimal number or a string gets the value typer's adapter gives it (the same
code for paths: typer's own path checks, after ``Path(value)``, which is what its adapter makes of
a string); any other value (and every value typer would refuse, so its error message is typer's own)
goes to typer's adapter, built then."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, get_args, get_origin

from typer._click.exceptions import BadParameter

try:  # typer's private coercion internals (as in typer 0.29): a typer without them keeps its own coercion
    from typer._coercion import RuntimeParam, build_runtime_param
    from typer._param_types import coerce_cli_path
except ImportError:  # install() then leaves every parameter to typer (tests/test_cli_startup.py hides them)
    RuntimeParam = None  # type: ignore[assignment,misc]

_INT = re.compile(r"-?[0-9]{1,18}")
_FLOAT = re.compile(r"-?[0-9]{1,15}(\.[0-9]{1,15})?")


class _Unplain(Exception):
    """The value is not one this module coerces: typer's adapter does."""


def _in_range(v: Any, info: Any) -> Any:
    if (info.min is not None and v < info.min) or (info.max is not None and v > info.max) or info.clamp:
        raise _Unplain
    return v


def _leaf(annotation: Any, value: Any, info: Any, param: Any, ctx: Any) -> Any:
    """``value`` coerced to ``annotation`` as typer's adapter would, or :class:`_Unplain`."""
    if info.parser is not None:
        raise _Unplain
    if annotation is str and type(value) is str:
        return value
    if annotation is bool and type(value) is bool:
        return value
    if annotation is int and (type(value) is int or type(value) is str and _INT.fullmatch(value)):
        return _in_range(int(value), info)
    if annotation is float and (type(value) in (int, float) or type(value) is str and _FLOAT.fullmatch(value)):
        return _in_range(float(value), info)
    if annotation is Path and info.path_type is None and (type(value) is str or isinstance(value, Path)):
        try:  # typer's own checks (exists, readable, ...); a refusal is typer's to word
            return coerce_cli_path(Path(value), info, path_type=Path, param=param, ctx=ctx)
        except BadParameter:
            raise _Unplain from None
    raise _Unplain


def _plain(descriptor: Any, value: Any, param: Any, ctx: Any) -> Any:
    ann, info = descriptor.annotation, descriptor.parameter_info
    if descriptor.file_annotation is not None or descriptor.is_choice:
        raise _Unplain
    if get_origin(ann) is list:
        (item,) = get_args(ann)
        return [_leaf(item, v, info, param, ctx) for v in (value if isinstance(value, (list, tuple)) else [value])]
    if get_origin(ann) is not None:
        raise _Unplain
    return _leaf(ann, value, info, param, ctx)


if RuntimeParam is not None:

    class PlainFirst(RuntimeParam):
        """typer's coercion of one parameter, plain values first (see above)."""

        descriptor: Any  # typer's TypeDescriptor of the parameter

        def __init__(self, descriptor: Any):
            super().__init__(parameter_info=descriptor.parameter_info, annotation=descriptor.annotation)
            object.__setattr__(self, "descriptor", descriptor)

        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            try:
                return _plain(self.descriptor, value, param, ctx)
            except _Unplain:
                return build_runtime_param(self.descriptor)._coerce_value(value, param=param, ctx=ctx)


def install(params: list) -> list:
    """``params`` (a typer command's), each coerced by :class:`PlainFirst` from now on."""
    if RuntimeParam is None:
        return params
    for p in params:
        if getattr(p, "_runtime_param", "absent") is None and hasattr(p, "type_descriptor"):
            try:
                p._runtime_param = PlainFirst(p.type_descriptor)
            except (TypeError, AttributeError):  # a typer whose RuntimeParam is built otherwise: its own coercion
                return params
    return params
