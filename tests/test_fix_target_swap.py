"""``fix --apply`` / ``--revert`` write the file they checked, or nothing: a process that swaps the
launch file for a symlink (to a file the user running perfscope may write) between the check and
the write must not get that file overwritten. The target is resolved once, held open with
O_NOFOLLOW, and every write is refused once the entry there is not the held file.

The swap is placed where a racing process hit it in the red team's trials (after perfscope's last
look, before its write: 2 of 40 tries): :class:`SwappingHost` is the real :class:`LocalFixHost`
whose one method also does the other process's swap at that moment; every read and write is real."""

from __future__ import annotations

import os

from perfscope.fixengine import engine
from perfscope.fixengine.host import LocalFixHost, SSHFixHost
from perfscope.fixengine.registry import get
from perfscope.remote.ssh import connect

from test_fix_launch import env_with, launch_text, req_for

FIX = get("torch-sampling")
VICTIM = b"root:x:0:0:root:/root:/bin/bash\n"  # what the link points at: must never change


class Swapping:
    """Mixed into a real fix host: the other process's swap, at ``at``."""

    def arm(self, target, victim, at: str):
        self.target, self.victim, self.at, self.swapped = str(target), str(victim), at, False
        return self

    def _swap(self):
        if not self.swapped:
            os.unlink(self.target)
            os.symlink(self.victim, self.target)
            self.swapped = True

    def sha256(self, path):
        digest = super().sha256(path)
        if self.at == "after-last-look" and path == self.target:
            self._swap()
        return digest

    def exists(self, path):
        if self.at == "before-restore":
            self._swap()
        return super().exists(path)


class SwappingHost(Swapping, LocalFixHost):
    def __init__(self, target, victim, at: str):
        super().__init__()
        self.arm(target, victim, at)


class SwappingSSHHost(Swapping, SSHFixHost):
    """The same over a real sshd on loopback (the host's file system is this one's)."""

    def __init__(self, session, target, victim, at: str):
        super().__init__(session)
        self.arm(target, victim, at)


def _setup(tmp_path):
    launch = tmp_path / "run.sh"
    launch.write_text(launch_text("--sampling-backend pytorch"))
    victim = tmp_path / "victim"
    victim.write_bytes(VICTIM)
    return launch, victim


def test_apply_refuses_when_the_launch_file_becomes_a_symlink_after_the_check(tmp_path):
    launch, victim = _setup(tmp_path)
    host = SwappingHost(launch, victim, "after-last-look")
    rep = engine.apply(FIX, host, req_for(launch, tmp_path), env_with())
    assert host.swapped
    assert victim.read_bytes() == VICTIM  # the link's target is untouched
    assert launch.is_symlink() and os.readlink(launch) == str(victim)  # and so is the link
    assert rep.outcome.kind == "refused" and "changed since the check (a symlink now)" in rep.outcome.reason
    assert not list((tmp_path / "state").rglob("manifest.json"))  # no manifest claims an apply


def test_revert_refuses_when_the_target_becomes_a_symlink_after_the_check(tmp_path):
    launch, victim = _setup(tmp_path)
    applied = engine.apply(FIX, LocalFixHost(), req_for(launch, tmp_path), env_with())
    assert applied.outcome.kind == "applied", applied.outcome.reason
    host = SwappingHost(launch, victim, "before-restore")
    rep = engine.revert(FIX, host, req_for(launch, tmp_path), env_with())
    assert host.swapped and victim.read_bytes() == VICTIM
    assert rep.outcome.kind == "refused" and "changed since the check" in rep.outcome.reason
    assert list((tmp_path / "state").rglob("manifest.json"))  # the apply's record stays, for a later revert


def test_a_target_that_is_a_symlink_at_the_check_is_patched_through_it(tmp_path):
    """Resolved once, at the check: a link that was there then still works, and stays a link."""
    real, _ = _setup(tmp_path)
    link = tmp_path / "link.sh"
    os.symlink(real, link)
    original = real.read_bytes()
    rep = engine.apply(FIX, LocalFixHost(), req_for(link, tmp_path), env_with())
    assert rep.outcome.kind == "applied", rep.outcome.reason
    assert link.is_symlink() and real.read_bytes() != original and b"flashinfer" in real.read_bytes()
    back = engine.revert(FIX, LocalFixHost(), req_for(link, tmp_path), env_with())
    assert back.outcome.kind == "reverted" and real.read_bytes() == original and link.is_symlink()


def test_over_ssh_apply_and_revert_refuse_a_target_swapped_for_a_symlink(sshd, tmp_path):
    launch, victim = _setup(tmp_path)
    with connect(sshd.target()) as s:
        host = SwappingSSHHost(s, launch, victim, "after-last-look")
        rep = engine.apply(FIX, host, req_for(launch, tmp_path), env_with())
        assert host.swapped and victim.read_bytes() == VICTIM and launch.is_symlink()
        assert rep.outcome.kind == "refused" and "changed since the check (a symlink now)" in rep.outcome.reason
        assert not list((tmp_path / "state").rglob("manifest.json"))
    launch.unlink()
    launch.write_text(launch_text("--sampling-backend pytorch"))
    with connect(sshd.target()) as s:
        assert engine.apply(FIX, SSHFixHost(s), req_for(launch, tmp_path), env_with()).outcome.kind == "applied"
        host = SwappingSSHHost(s, launch, victim, "before-restore")
        rep = engine.revert(FIX, host, req_for(launch, tmp_path), env_with())
        assert host.swapped and victim.read_bytes() == VICTIM
        assert rep.outcome.kind == "refused" and "changed since the check" in rep.outcome.reason
