"""A local port forward: 127.0.0.1 here -> a port on the SSH host's side, over ``direct-tcpip``."""

from __future__ import annotations

import select
import socket
import threading

import paramiko

from perfscope.errors import RemoteError
from perfscope.remote.ssh.errors import ServerDown
from perfscope.remote.ssh.target import DEFAULT_CONNECT_TIMEOUT


class LocalForward:
    """127.0.0.1:<ephemeral> on this machine -> ``remote_host:remote_port`` as the SSH host sees
    it, one ``direct-tcpip`` channel per accepted connection. Use as a context manager."""

    def __init__(
        self,
        transport: paramiko.Transport,
        remote_port: int,
        remote_host: str = "127.0.0.1",
        *,
        label: str = "",
        timeout: float = DEFAULT_CONNECT_TIMEOUT,
    ):
        self._transport = transport
        self.remote_host = remote_host
        self.remote_port = int(remote_port)
        self._label = label or "the host"
        self._timeout = timeout
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self._listener.settimeout(0.5)
        self.port: int = self._listener.getsockname()[1]
        self._closed = threading.Event()
        self._pairs: set[tuple[socket.socket, paramiko.Channel]] = set()
        self._lock = threading.Lock()
        self.last_error: str | None = None
        self._thread = threading.Thread(target=self._accept_loop, name=f"fwd-{self.port}", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _open(self, origin=("127.0.0.1", 0)) -> paramiko.Channel:
        try:
            return self._transport.open_channel(
                "direct-tcpip", (self.remote_host, self.remote_port), origin, timeout=self._timeout
            )
        except paramiko.ChannelException as e:
            where = f"{self.remote_host}:{self.remote_port} on {self._label}"
            if e.code == 1:  # administratively prohibited
                raise RemoteError(
                    f"the SSH server on {self._label} forbids port forwarding, so {where} cannot be reached",
                    hint="set AllowTcpForwarding local (or yes) in its sshd_config",
                ) from None
            raise ServerDown(
                f"nothing answers on {where}: is the inference server running, and on this --port?"
            ) from None
        except (paramiko.SSHException, EOFError, OSError) as e:
            raise RemoteError(f"SSH connection to {self._label} lost while opening a channel: {e}") from None

    def check(self) -> None:
        """Raise :class:`ServerDown` if nothing listens on the remote port (opens and closes one
        channel)."""
        self._open().close()

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                client, addr = self._listener.accept()
            except socket.timeout:
                continue
            except OSError:
                break
            threading.Thread(target=self._serve, args=(client, addr), daemon=True).start()

    def _serve(self, client: socket.socket, addr) -> None:
        try:
            chan = self._open(addr)
        except RemoteError as e:
            self.last_error = str(e)
            client.close()
            return
        pair = (client, chan)
        with self._lock:
            self._pairs.add(pair)
        try:
            client.setblocking(True)
            while not self._closed.is_set():
                r, _, _ = select.select([client, chan], [], [], 0.5)
                if client in r:
                    data = client.recv(65536)
                    if not data:
                        chan.shutdown_write()
                        # keep reading the reply until the remote side closes
                        while not self._closed.is_set():
                            data = chan.recv(65536)
                            if not data:
                                break
                            client.sendall(data)
                        break
                    chan.sendall(data)
                if chan in r:
                    data = chan.recv(65536)
                    if not data:
                        break
                    client.sendall(data)
        except (OSError, EOFError, paramiko.SSHException):
            pass
        finally:
            with self._lock:
                self._pairs.discard(pair)
            for c in (chan, client):
                try:
                    c.close()
                except Exception:
                    pass

    def close(self) -> None:
        self._closed.set()
        try:
            self._listener.close()
        except OSError:
            pass
        with self._lock:
            pairs = list(self._pairs)
        for client, chan in pairs:
            for c in (chan, client):
                try:
                    c.close()
                except Exception:
                    pass
        self._thread.join(timeout=2)

    def __enter__(self) -> "LocalForward":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
