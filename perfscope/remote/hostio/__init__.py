"""What ``perfscope trace`` needs from the machine the inference server runs on, over SSH
(:class:`SSHHost`) or on this machine (:class:`LocalHost`, for ``--url``): run a command, make a
folder, list / check / hash / fetch trace files, find the server's python, read nvidia-smi.

The package, one job a module: ``traces`` (trace files: their names, whether one is complete, the
listing's entries), ``probes`` (what the host says about its server: versions, GPUs, the listening
process), ``base`` (:class:`HostIO`, everything built on ``run``), ``sshhost`` and ``local`` (the two
transports)."""

from perfscope.remote.hostio.base import HostIO
from perfscope.remote.hostio.local import LocalHost, kill_group
from perfscope.remote.hostio.probes import NVSMI_FIELDS, parse_nvidia_smi
from perfscope.remote.hostio.sshhost import SSHHost
from perfscope.remote.hostio.traces import (
    ARGV_BATCH_BYTES,
    GZ_OUT_BLOCK,
    GZ_READ_BLOCK,
    TRACE_SUFFIXES,
    RemoteFile,
    argv_batches,
    gzip_intact_local,
    is_trace_name,
    trace_file_complete,
)

__all__ = [
    "ARGV_BATCH_BYTES",
    "GZ_OUT_BLOCK",
    "GZ_READ_BLOCK",
    "NVSMI_FIELDS",
    "TRACE_SUFFIXES",
    "HostIO",
    "LocalHost",
    "RemoteFile",
    "SSHHost",
    "argv_batches",
    "gzip_intact_local",
    "is_trace_name",
    "kill_group",
    "parse_nvidia_smi",
    "trace_file_complete",
]
