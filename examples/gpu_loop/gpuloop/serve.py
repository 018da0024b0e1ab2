"""Start and stop the reproduction server; a fixed greedy sample."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

from gpuloop.base import REPO, _get_json, now_s


class ServeMixin:
    def start_server(self, tag: str) -> str:
        a = self.a
        root = self.work / "srv"
        url = f"http://127.0.0.1:{a.port}"
        argv = [self.py, "-m", "examples.repro_server", "--port", str(a.port), "--device", a.device,
                "--context-length", "8192", "--seed", "0", *self.size_args()]
        if self.cuda:
            argv += ["--cuda-graph", "--cuda-graph-max-bs", "4", "--flashinfer-backend", a.flashinfer_backend]
        else:  # the overlap scheduler is the CUDA default; on CPU the same code path runs in order
            argv += ["--threads", "2", "--enable-overlap-schedule"]
        env = dict(os.environ)
        # the scratch copy must win over the repository's examples/ package
        env["PYTHONPATH"] = os.pathsep.join([str(root)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
                                                           if p and Path(p).resolve() != REPO.resolve()])
        log = open(self.logs / f"server-{tag}.log", "wb")
        t = time.monotonic()
        self.server = subprocess.Popen(argv, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT,
                                       start_new_session=True)
        self.summary.setdefault("servers", {})[tag] = {"argv": argv}
        deadline = time.monotonic() + min(a.server_timeout, self.left() - 10)
        while time.monotonic() < deadline:
            if self.server.poll() is not None:
                raise RuntimeError(f"server {tag} exited rc {self.server.returncode}: "
                                   f"{(self.logs / f'server-{tag}.log').read_text()[-1500:]}")
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            time.sleep(0.5)
        else:
            self.stop_server()
            raise RuntimeError(f"server {tag} not healthy in time: {(self.logs / f'server-{tag}.log').read_text()[-1500:]}")
        up = round(time.monotonic() - t, 1)
        info = _get_json(url + "/server_info")
        self.summary["servers"][tag].update(startup_s=up, kv_strategy=info.get("kv_strategy"),
                                            flashinfer=info.get("flashinfer_version"),
                                            device_name=info.get("device_name"),
                                            disable_overlap_schedule=info.get("disable_overlap_schedule"))
        print(f"[{now_s():6.1f}s] server {tag} up in {up}s (kv_strategy {info.get('kv_strategy')})", flush=True)
        return url

    def stop_server(self) -> None:
        p, self.server = self.server, None
        if p is None or p.poll() is not None:
            return
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(10)

    def sample(self, url: str) -> list[int]:
        """A fixed greedy request: its token ids, compared across the runs."""
        body = json.dumps({"input_ids": [(37 * i) % 997 + 1 for i in range(512)],
                           "sampling_params": {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True}}).encode()
        req = urllib.request.Request(url + "/generate", data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            return json.loads(r.read())["output_ids"]
