"""The typed shape of a Kineto chrome trace, as far as perfscope reads it.

msgspec decodes only these fields and skips the rest of each event without building it, which is
what makes loading fast and small. Shape/dtype arguments stay raw JSON (``msgspec.Raw``) and are
decoded only for the few ops a report shows.
"""

from __future__ import annotations

from typing import Any, Union

import msgspec


class Args(msgspec.Struct, gc=False, omit_defaults=True):
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


class Event(msgspec.Struct, gc=False, omit_defaults=True):
    ph: str = ""
    cat: str = ""
    name: str = ""
    pid: Union[int, str] = 0
    tid: Union[int, str] = 0
    ts: float = 0.0
    dur: float = 0.0
    args: Union[Args, None] = None
    id: Union[int, str, None] = None


class TraceFile(msgspec.Struct, gc=False):
    traceEvents: list[Event] = []
    deviceProperties: Any = None
    distributedInfo: Any = None
    schemaVersion: Any = None
    displayTimeUnit: Any = None
    with_stack: Any = None
    record_shapes: Any = None
    traceName: Any = None
    roctracer_version: Any = None
    hip_runtime_version: Any = None
    cuda_runtime_version: Any = None


DECODER = msgspec.json.Decoder(TraceFile)
