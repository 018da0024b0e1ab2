"""The server's host over SSH (:class:`SSHHost`): commands and files through one SSH session."""

from __future__ import annotations

import stat

from perfscope.errors import InputError
from perfscope.remote.hostio.base import HostIO
from perfscope.remote.hostio.traces import RemoteFile, is_trace_name
from perfscope.remote.ssh import RemoteError, SSHSession


class SSHHost(HostIO):
    def __init__(self, session: SSHSession):
        self.s = session
        self.label = session.target.label

    def run(self, argv, timeout=60.0):
        return self.s.run(argv, timeout=timeout)

    def alive(self):
        try:
            self.s.transport  # noqa: B018 (the property raises RemoteError once the session is closed)
        except RemoteError:
            return False
        return True

    def list_traces(self, folder, match=is_trace_name):
        out = []
        for e in self.s.listdir(folder):
            if match(e.filename) and stat.S_ISREG(e.st_mode or 0):
                out.append(
                    RemoteFile(e.filename, f"{folder.rstrip('/')}/{e.filename}", e.st_size or 0, e.st_mtime or 0)
                )
        return sorted(out, key=lambda f: f.name)

    def sha256(self, path):
        return self.s.sha256(path)

    def fetch(self, path, local, expected_sha256, progress=None):
        return self.s.download(path, local, expected_sha256=expected_sha256, progress=progress)

    def remove(self, paths, folder):
        self.s.remove(paths, folder)

    def put(self, path, data):
        self.s.write_bytes_atomic(path, data, mode=0o600)

    def get(self, path, cap):
        try:
            return bytes(self.s.read_bytes(path, regular_cap=cap))
        except InputError as e:  # a pipe, a folder, or past the cap: the host's answer is unusable
            raise RemoteError(str(e).replace("PERFSCOPE_MAX_FIX_FILE_MB", "PERFSCOPE_MAX_REPLY_MB")) from None

    def close(self):
        self.s.close()
