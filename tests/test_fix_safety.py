"""The fix engine's safety on real SGLang sources of a released wheel (tests/sglang_sources.py):
a full disk or read-only file system leaves no manifest and the file intact, concurrent applies
are serialised by the state folder's lock (locally and on the host), a kill at any moment leaves
the original or the patched file and no temp file, symlinked and read-only targets, a revert
whose backup is gone.

Not proven by a test of its own: the patch's temp file in the state folder falls back to the
package folder when the two are on different file systems.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from clirun import invoke, one_line
from paths import REPO

pytestmark = pytest.mark.usefixtures("no_agent")  # only the keys a test names are tried


def _fix_setup(tmp_path, folder="pkg"):
    from sglang_sources import MLA, sglang_file

    pkg = tmp_path / folder
    pkg.mkdir(parents=True, exist_ok=True)
    target = pkg / "flashinfer_mla_backend.py"
    original = sglang_file("0.5.12", MLA)
    target.write_bytes(original)
    return target, original


def _fix_req(target, state):
    from perfscope.fixengine import engine

    return engine.FixRequest(target_file=str(target), state_dir=str(state))


def _manifests(state):
    return [p for p in Path(state).rglob("manifest.json")]


@pytest.fixture
def small_fs(tmp_path):
    """A real 192 KiB tmpfs (this suite runs as root; the test fails, not skips, when it cannot mount)."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=192k", "tmpfs", str(mnt)], capture_output=True, text=True)
    assert r.returncode == 0, f"cannot mount a tmpfs for the full-disk test: {r.stderr}"
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_fix_on_a_full_disk_leaves_no_manifest_and_the_file_intact(small_fs, tmp_path):
    """A full disk (ENOSPC) gave an OSError traceback and left a manifest claiming an apply that
    never happened: one line, exit 2, no manifest, the file intact (a real 192 KiB tmpfs)."""
    target, original = _fix_setup(small_fs)
    filler = small_fs / "filler"
    try:  # fill the file system: what is left is less than the patched file
        with open(filler, "wb", buffering=0) as f:
            while True:
                f.write(b"\0" * 4096)
    except OSError:
        pass
    state = tmp_path / "state"
    rc, _, err = invoke("fix", "fp8-kv-cast", "--target-file", str(target), "--state-dir", str(state), "--apply",
                          "--kv-cache-dtype", "fp8_e4m3")
    assert rc == 2 and "No space left" in one_line(err)
    assert target.read_bytes() == original
    assert _manifests(state) == []
    assert [p.name for p in target.parent.iterdir()] == [target.name]  # no temp file left


def test_fix_on_a_read_only_file_system_leaves_no_manifest(small_fs, tmp_path):
    """The same on a read-only file system (EROFS)."""
    target, original = _fix_setup(small_fs)
    r = subprocess.run(["mount", "-o", "remount,ro", str(small_fs)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    state = tmp_path / "state"
    rc, _, err = invoke("fix", "fp8-kv-cast", "--target-file", str(target), "--state-dir", str(state), "--apply",
                          "--kv-cache-dtype", "fp8_e4m3")
    assert rc == 2 and "Read-only file system" in one_line(err)
    assert target.read_bytes() == original and _manifests(state) == []


_APPLY = """
import sys
sys.path.insert(0, {repo!r})
from perfscope.fixengine import engine
from perfscope.fixengine.host import LocalFixHost
from perfscope.fixengine.registry import get
req = engine.FixRequest(target_file={target!r}, state_dir={state!r}, strategy=sys.argv[1],
                        overrides={{"kv_cache_dtype": "fp8_e4m3", "compute_cap": "9.0", "flashinfer_version": "0.6.18"}})
print(engine.apply(get("fp8-kv-cast"), LocalFixHost(), req).outcome.kind, flush=True)
"""


@pytest.mark.slow  # 8 fix processes, two at a time: 4-6 s of CPU, 6-12 s on 2 cores
def test_two_concurrent_applies_to_one_file_are_serialised(tmp_path):
    """Two concurrent applies with different strategies: serialised by the lock, the manifest
    names the strategy in the file."""
    import hashlib

    from perfscope.fixengine import engine
    from perfscope.fixengine.host import LocalFixHost
    from perfscope.fixengine.registry import get

    for i in range(4):
        target, original = _fix_setup(tmp_path / f"try{i}")
        state = tmp_path / f"try{i}" / "state"
        code = _APPLY.format(repo=str(REPO), target=str(target), state=str(state))
        procs = [subprocess.Popen([sys.executable, "-c", code, s], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for s in ("pages", "native")]
        kinds = sorted(p.communicate(timeout=120)[0].strip() for p in procs)
        assert kinds.count("applied") == 1, kinds  # the other one saw the patched file
        man = json.loads(_manifests(state)[0].read_text())
        assert man["sha256_after"] == hashlib.sha256(target.read_bytes()).hexdigest()
        rep = engine.revert(get("fp8-kv-cast"), LocalFixHost(), _fix_req(target, state))
        assert rep.outcome.kind == "reverted" and target.read_bytes() == original


def test_revert_with_a_deleted_backup_is_refused_exit_4(tmp_path):
    """--revert with a deleted backup said "failed" (exit 1): refused, exit 4."""
    target, original = _fix_setup(tmp_path)
    state = tmp_path / "state"
    base = ["fix", "fp8-kv-cast", "--target-file", str(target), "--state-dir", str(state), "--kv-cache-dtype", "fp8_e4m3"]
    rc, _, err = invoke(*base, "--apply")
    assert rc == 0, err
    for p in Path(state).rglob("original-*.py"):
        p.unlink()
    rc, out, err = invoke(*base, "--revert")
    assert rc == 4 and "missing" in (out + err)


def test_symlinked_fix_target_stays_a_symlink_after_apply_and_revert(tmp_path):
    """The CLI's --apply/--revert on a symlinked target: the link stays a link, the bytes are
    restored."""
    from perfscope.fixengine import engine
    from perfscope.fixengine.host import LocalFixHost
    from perfscope.fixengine.registry import get

    real, original = _fix_setup(tmp_path, "store")
    link = tmp_path / "site" / "flashinfer_mla_backend.py"
    link.parent.mkdir()
    link.symlink_to(real)
    req = _fix_req(link, tmp_path / "state")
    req.overrides = {"kv_cache_dtype": "fp8_e4m3"}
    assert engine.apply(get("fp8-kv-cast"), LocalFixHost(), req).outcome.kind == "applied"
    assert link.is_symlink() and real.read_bytes() != original
    assert engine.revert(get("fp8-kv-cast"), LocalFixHost(), req).outcome.kind == "reverted"
    assert link.is_symlink() and real.read_bytes() == original
    assert sorted(p.name for p in real.parent.iterdir()) == [real.name]


def test_read_only_target_is_refused(tmp_path):
    """A 0444 target was patched anyway: refused."""
    from perfscope.fixengine import engine
    from perfscope.fixengine.host import LocalFixHost
    from perfscope.fixengine.registry import get

    target, original = _fix_setup(tmp_path)
    os.chmod(target, 0o444)
    req = _fix_req(target, tmp_path / "state")
    req.overrides = {"kv_cache_dtype": "fp8_e4m3"}
    rep = engine.apply(get("fp8-kv-cast"), LocalFixHost(), req)
    assert rep.outcome.kind == "refused" and "read-only" in rep.outcome.reason
    assert target.read_bytes() == original and _manifests(tmp_path / "state") == []


@pytest.mark.slow  # 13 fix processes, each killed or run to the end: 6.5 s of CPU, 11 s on 2 cores
def test_kill_at_any_moment_of_apply_leaves_original_or_patched_and_no_temp_file(tmp_path):
    """SIGKILL during --apply left a .tmp in the package folder (2 of 40): the patch's temp file
    lives in the state folder (same file system), else the package folder; the target is always
    the original or the patched file."""
    import hashlib

    target, original = _fix_setup(tmp_path / "ref")
    state = tmp_path / "ref" / "state"
    code = _APPLY.format(repo=str(REPO), target=str(target), state=str(state))
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-c", code, "pages"], check=True, capture_output=True, timeout=120)
    full = time.monotonic() - t0
    patched = target.read_bytes()
    allowed = {hashlib.sha256(original).hexdigest(), hashlib.sha256(patched).hexdigest()}
    for i in range(12):
        target, _ = _fix_setup(tmp_path / f"k{i}")
        state = tmp_path / f"k{i}" / "state"
        p = subprocess.Popen([sys.executable, "-c", _APPLY.format(repo=str(REPO), target=str(target), state=str(state)),
                              "pages"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(full * (0.4 + 0.6 * i / 11))  # spread over the apply, interpreter start-up excluded
        p.kill()
        p.wait(30)
        assert hashlib.sha256(target.read_bytes()).hexdigest() in allowed
        assert [q.name for q in target.parent.iterdir()] == [target.name]  # no temp file in the package folder


def test_fix_lock_serialises_two_holders_locally(tmp_path):
    """Two --apply at once were not locked against each other (9 of 20 left a manifest naming
    the other strategy): a lock in the state root (flock locally)."""
    from perfscope.errors import FixRefused
    from perfscope.fixengine.host import LocalFixHost

    lock = str(tmp_path / "state" / ".lock")
    holder = subprocess.Popen([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(REPO)!r})\n"
                               "from perfscope.fixengine.host import LocalFixHost\n"
                               f"with LocalFixHost().lock({lock!r}):\n print('held', flush=True); sys.stdin.read()"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    t0 = time.monotonic()
    with pytest.raises(FixRefused, match="another perfscope fix"):
        with LocalFixHost().lock(lock, timeout=1):
            pass
    assert time.monotonic() - t0 >= 1
    holder.stdin.close()
    holder.wait(10)
    with LocalFixHost().lock(lock, timeout=5):  # released when the holder ended
        pass


def test_fix_lock_serialises_two_holders_on_the_host(sshd, tmp_path):
    """The same lock on the host: flock held by a python3 on an SSH channel, released when the
    connection dies."""
    from perfscope.errors import FixRefused
    from perfscope.fixengine.host import SSHFixHost
    from perfscope.remote.ssh import connect

    lock = str(tmp_path / "rstate" / ".lock")
    with connect(sshd.target()) as s1, connect(sshd.target()) as s2:
        with SSHFixHost(s1).lock(lock):
            with pytest.raises(FixRefused):
                with SSHFixHost(s2).lock(lock, timeout=1):
                    pass
        with SSHFixHost(s2).lock(lock, timeout=5):
            pass


def test_symlinked_target_stays_a_symlink_through_apply_and_revert_writes(tmp_path):
    """A symlinked target became a regular file on --apply and --revert: the writer writes the
    link's target."""
    from perfscope.fixengine.host import LocalFixHost

    real = tmp_path / "pkg" / "mod.py"
    real.parent.mkdir()
    real.write_text("original\n")
    link = tmp_path / "site" / "mod.py"
    link.parent.mkdir()
    link.symlink_to(real)
    h = LocalFixHost()
    h.write_bytes_atomic(str(link), b"patched\n")
    assert link.is_symlink() and real.read_text() == "patched\n"
    h.write_bytes_atomic(str(link), b"original\n")
    assert link.is_symlink() and real.read_text() == "original\n"
    assert sorted(p.name for p in real.parent.iterdir()) == ["mod.py"]  # no stray temp file
