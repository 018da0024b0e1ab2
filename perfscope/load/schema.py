"""The typed shape of one Kineto chrome-trace event, as far as perfscope reads it.

msgspec decodes only these fields and skips the rest without building it. Shape/dtype arguments
stay raw JSON (``msgspec.Raw``) and are decoded only for the few ops a report shows.
"""

from __future__ import annotations

from typing import Any, Union

import msgspec


class Args(msgspec.Struct, gc=False):
    correlation: Union[int, None] = None
    external_id: Union[int, None] = msgspec.field(default=None, name="External id")
    stream: Union[int, None] = None
    device: Union[int, None] = None
    grid: Union[list[int], None] = None
    block: Union[list[int], None] = None
    input_type: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Input type")
    input_dims: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Input Dims")
    concrete: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Concrete Inputs")
    python_id: Union[int, None] = msgspec.field(default=None, name="Python id")
    python_parent: Union[int, None] = msgspec.field(default=None, name="Python parent id")


class Event(msgspec.Struct, gc=False):
    ph: str = ""
    cat: str = ""
    name: str = ""
    pid: Union[int, str] = 0
    tid: Union[int, str] = 0
    ts: float = 0.0
    dur: float = 0.0
    args: Union[Args, None] = None


class Top(msgspec.Struct, gc=False):
    """The file's top level: events stay raw slices of the buffer, decoded one by one."""

    traceEvents: Union[list[msgspec.Raw], None] = None
    deviceProperties: Any = None
    distributedInfo: Any = None
    with_stack: Any = None
    record_shapes: Any = None
    roctracer_version: Any = None
    hip_runtime_version: Any = None
    cuda_runtime_version: Any = None
    traceName: Any = None
    # present in PyTorch execution traces (not Kineto): used to refuse them clearly
    nodes: Any = None
    schema: Any = None


TOP = msgspec.json.Decoder(Top)
EVENT = msgspec.json.Decoder(Event)
# Lax fallback for traces whose events break the typed schema (strings for numbers, ...).
ANY_EVENT = msgspec.json.Decoder()
