"""``trace --url``: the server's profile folder is read in place on this machine, and whoever can
write there (the server's user) must not make perfscope copy a file it may read but they may not:
a symlink in the folder is neither listed nor hashed nor copied, even when it is planted between
the listing and the copy. Real files, real links, the real :class:`LocalHost` that ``--url``
uses; no server is needed for what is tested (how the folder is read)."""

from __future__ import annotations

import gzip
import os

import pytest

from perfscope.errors import RemoteError
from perfscope.remote.hostio import LocalHost


@pytest.fixture
def folder(tmp_path):
    """A profile folder with one real trace, and a 0600 secret outside it."""
    prof = tmp_path / "profile"
    prof.mkdir()
    (prof / "real.trace.json.gz").write_bytes(gzip.compress(b'{"traceEvents": []}'))
    secret = tmp_path / "secret"
    secret.write_bytes(b"root-only secret\n")
    secret.chmod(0o600)
    return prof, secret


def test_a_symlink_in_the_profile_folder_is_not_listed(folder):
    prof, secret = folder
    os.symlink(secret, prof / "planted.trace.json.gz")
    names = [f.name for f in LocalHost().list_traces(str(prof))]
    assert names == ["real.trace.json.gz"]


def test_a_symlink_planted_after_the_listing_is_not_copied_or_hashed(folder, tmp_path):
    prof, secret = folder
    io = LocalHost()
    listed = io.list_traces(str(prof))
    # the server's user swaps the listed trace for a link to the secret
    path = listed[0].path
    os.unlink(path)
    os.symlink(secret, path)
    local = tmp_path / "run" / "copy.trace.json.gz"
    with pytest.raises(RemoteError, match="symlink"):
        io.sha256(path)
    with pytest.raises(RemoteError, match="symlink"):
        io.fetch(path, local, "")
    run = tmp_path / "run"
    assert not local.exists() and (not run.exists() or not any(run.iterdir()))  # no temp file left


def test_a_regular_trace_is_still_copied_intact(folder, tmp_path):
    prof, _ = folder
    io = LocalHost()
    f = io.list_traces(str(prof))[0]
    local = tmp_path / "copy.trace.json.gz"
    digest = io.fetch(f.path, local, io.sha256(f.path))
    assert local.read_bytes() == (prof / "real.trace.json.gz").read_bytes() and len(digest) == 64
