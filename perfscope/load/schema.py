"""The typed shape of one Kineto chrome-trace event, as far as perfscope reads it.

msgspec decodes only these fields and skips the rest without building it. Shape/dtype arguments
stay raw JSON (``msgspec.Raw``) and are decoded only for the few ops a report shows.
"""

from __future__ import annotations

from typing import Annotated, Any, Union

import msgspec


# Values the schema refuses (the event then goes to the reader's lax decoder): numbers out of range for
# analysis. Kineto timestamps may be Unix-epoch microseconds (~1.7e15 in 2022-2026, e.g. HTA's test
# traces): bounded at ~3,000 years; a duration at ~31 years; ids, streams and geometry are int64.
MAX_TS_US = 1e17
MAX_DUR_US = 1e15
I64 = Annotated[int, msgspec.Meta(ge=-(1 << 63), le=(1 << 63) - 1)]
TS = Annotated[float, msgspec.Meta(gt=-MAX_TS_US, lt=MAX_TS_US)]
DUR = Annotated[float, msgspec.Meta(ge=0.0, lt=MAX_DUR_US)]


class Args(msgspec.Struct, gc=False):
    correlation: Union[I64, None] = None
    external_id: Union[I64, None] = msgspec.field(default=None, name="External id")
    stream: Union[I64, None] = None
    device: Union[I64, None] = None
    grid: Union[list[I64], None] = None
    block: Union[list[I64], None] = None
    input_type: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Input type")
    input_dims: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Input Dims")
    concrete: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Concrete Inputs")
    python_id: Union[I64, None] = msgspec.field(default=None, name="Python id")
    python_parent: Union[I64, None] = msgspec.field(default=None, name="Python parent id")


class Event(msgspec.Struct, gc=False):
    ph: str = ""
    cat: str = ""
    name: str = ""
    pid: Union[I64, str] = 0
    tid: Union[I64, str] = 0
    ts: TS = 0.0
    dur: DUR = 0.0
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
