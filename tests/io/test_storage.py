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


# A name fsspec would read as a glob: `[code]` is a character class, `*` and `?` wildcards
MAGIC = "0003-clean[code]-*?"


@pytest.fixture(params=["local", pytest.param("gcs", marks=pytest.mark.gcs)])
def magic_root(request, tmp_path):
    """A directory whose name holds `[`, `*` and `?`, once on local disk and once on the GCS emulator."""
    base = str(tmp_path) if request.param == "local" else request.getfixturevalue("gcs_bucket")
    return storage.join(base, MAGIC)


def test_remove_takes_a_path_with_glob_characters_literally(magic_root):
    attempt = storage.join(magic_root, "clean", "3f9a", "attempt-20261123T014501-1a2b3c")
    files = [storage.join(attempt, name) for name in ("docs-00000-of-00002.parquet", "rejected/empty.jsonl")]
    # what a glob reading of the name would match: a sibling named with one character of the class
    sibling = storage.join(storage.parent(magic_root), "0003-cleanc-xy", "keep.txt")
    for path in [*files, sibling, storage.join(magic_root, "clean", "3f9a", "_SUCCESS.json")]:
        storage.write_bytes(path, b"x")
    storage.remove(files[0])                                      # one file
    assert not storage.exists(files[0]) and storage.exists(files[1])
    storage.remove(attempt)                                       # a whole tree
    assert storage.sizes(attempt) == {} and not storage.exists(files[1])
    assert storage.listdir(storage.join(magic_root, "clean", "3f9a")) == ["_SUCCESS.json"]
    assert storage.read_bytes(sibling) == b"x"                    # nothing else matched
    storage.remove(attempt)                                       # gone already: fine
    storage.remove(magic_root)
    assert not storage.exists(magic_root) and storage.exists(sibling)


@pytest.mark.gcs
def test_remove_raises_a_failed_delete_naming_the_object(gcs_bucket, monkeypatch):
    tree = storage.join(gcs_bucket, MAGIC, "attempt-x")
    for name in ("a.txt", "b.txt", "c.txt"):
        storage.write_bytes(storage.join(tree, name), b"x")
    fs, _ = storage.filesystem(tree)
    real = fs._rm_file

    async def refuse_b(path, **kwargs):
        if path.endswith("/b.txt"):
            raise PermissionError(f"403 Forbidden: {path}")
        await real(path, **kwargs)

    monkeypatch.setattr(fs, "_rm_file", refuse_b)
    with pytest.raises(OSError, match=r"cannot delete gs://.*\[code\]-\*\?/attempt-x/b\.txt "
                                      r"\(PermissionError"):
        storage.remove(tree)
    monkeypatch.undo()
    assert storage.listdir(tree) == ["b.txt"]                     # the others were deleted


def test_an_escaped_directory_lists_its_own_files_not_a_sibling_s(magic_root):
    storage.write_bytes(storage.join(magic_root, "model.safetensors"), b"x")
    sibling = storage.join(storage.parent(magic_root), "0003-cleanc-xy", "config.json")  # `[code]` as a class
    storage.write_bytes(sibling, b"y")
    assert storage.escape("/plain/dir") == "/plain/dir"          # ordinary paths (and keys) as they were
    assert list(storage.versions(storage.join(magic_root, "*"))) == [sibling]    # the hazard: read as a glob
    assert list(storage.versions(storage.join(storage.escape(magic_root), "*"))) == \
        [storage.join(magic_root, "model.safetensors")]
    assert list(storage.versions(storage.escape(sibling))) == [sibling]
