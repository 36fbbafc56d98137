"""Storage: local paths and gs:// URLs through one set of functions; local copies that clean up."""

import os

import pytest

from stages.io import storage


def test_local_files_keep_local_paths(tmp_path):
    paths = [str(tmp_path / "a.bin"), str(tmp_path / "b.bin")]
    for p in paths:
        storage.write_bytes(p, b"x")
    with storage.local_files(paths) as local:
        assert local == paths
    with storage.local_files([storage.FILE_SCHEME + paths[0]]) as local:
        assert local == [paths[0]]
    assert all(os.path.exists(p) for p in paths)          # the caller's own files are never removed


@pytest.mark.gcs
def test_local_files_copy_gcs_objects_and_remove_the_copies(tmp_path, gcs_bucket):
    local_source = str(tmp_path / "a.bin")
    storage.write_bytes(local_source, b"local")
    remote = [storage.join(gcs_bucket, "shard", "x.bin"), storage.join(gcs_bucket, "other", "x.bin")]
    storage.write_bytes(remote[0], b"first")
    storage.write_bytes(remote[1], b"second: same file name, another folder")
    with storage.local_files([remote[0], local_source, remote[1]]) as local:
        assert local[1] == local_source
        assert [storage.read_bytes(p) for p in local] == [b"first", b"local",
                                                         b"second: same file name, another folder"]
        copies = [local[0], local[2]]
    assert not any(os.path.exists(p) for p in copies)     # the temporary copies are gone
    assert os.path.exists(local_source)


def test_local_files_clean_up_when_the_block_fails(tmp_path, monkeypatch):
    made = []
    real = storage.tempfile.TemporaryDirectory

    def remember(*args, **kwargs):
        d = real(*args, **kwargs)
        made.append(d.name)
        return d

    monkeypatch.setattr(storage.tempfile, "TemporaryDirectory", remember)
    monkeypatch.setattr(storage, "filesystem", lambda path: (_FakeRemote(), path))
    with pytest.raises(RuntimeError, match="boom"), storage.local_files(["gs://b/x.bin"]):
        raise RuntimeError("boom")
    assert made and not os.path.exists(made[0])


class _FakeRemote:
    """A remote filesystem of one 3-byte object (the failure path needs no server)."""

    def get_file(self, remote, local):
        with open(local, "wb") as f:
            f.write(b"abc")

    def size(self, remote):
        return 3


def test_paths_and_urls():
    assert storage.absolute("file:///tmp/x") == "/tmp/x"
    assert storage.absolute("gs://b/x") == "gs://b/x"
    assert storage.join("gs://b", "c", "d") == "gs://b/c/d"
    assert storage.parent("gs://b/c/d") == "gs://b/c"
    assert storage.hub_url("datasets/HuggingFaceFW/fineweb") == "hf://datasets/HuggingFaceFW/fineweb"
    with pytest.raises(ValueError, match="gs://b/x is not a local path"):
        storage.local_path("gs://b/x")


def test_tensorstore_is_pointed_at_the_emulator_only_for_gcs(monkeypatch):
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "127.0.0.1:9")
    monkeypatch.delenv("TENSORSTORE_GCS_HTTP_URL", raising=False)
    assert storage.for_tensorstore("relative/dir") == os.path.abspath("relative/dir")
    assert "TENSORSTORE_GCS_HTTP_URL" not in os.environ
    assert storage.for_tensorstore("gs://b/ckpt") == "gs://b/ckpt"
    assert os.environ["TENSORSTORE_GCS_HTTP_URL"] == "http://127.0.0.1:9"
