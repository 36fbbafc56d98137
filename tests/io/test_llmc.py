"""The llm.c shard format: one writer, one reader, for 16- and 32-bit tokens."""

import numpy as np
import pytest

from stages.io import llmc, storage


def numpy_read(path: str) -> tuple[np.ndarray, np.ndarray]:
    """An independent llm.c reader: (header (256,) int32, tokens)."""
    data = storage.read_bytes(path)
    header = np.frombuffer(data[:1024], dtype="<i4")
    dtype = {20240520: "<u2", 20240801: "<u4"}[int(header[0])]
    tokens = np.frombuffer(data[1024:], dtype=dtype)
    assert header[2] == len(tokens)
    return header, tokens



@pytest.mark.parametrize("vocab_size", [500, 2**16, 2**16 + 1, 100_000])
def test_llmc_round_trip_for_16_and_32_bit_tokens(tmp_path, vocab_size):
    rng = np.random.default_rng(0)
    pieces = [rng.integers(0, vocab_size, n) for n in (0, 1000, 17)]
    path = str(tmp_path / "x.bin")
    assert llmc.write(path, pieces, vocab_size) == 1017
    header, tokens = numpy_read(path)
    wide = vocab_size > 2**16
    assert header[:3].tolist() == ([20240801, 7, 1017] if wide else [20240520, 1, 1017])
    assert tokens.dtype == (np.uint32 if wide else np.uint16)
    assert tokens.tolist() == np.concatenate(pieces).tolist()
    assert llmc.read(path).tolist() == tokens.tolist() == llmc.read(path, mmap=True).tolist()
    assert storage.sizes(str(tmp_path))["x.bin"] == llmc.file_size(1017, vocab_size)


def test_llmc_read_rejects_other_files(tmp_path):
    bad = tmp_path / "bad.bin"
    bad.write_bytes(b"\0" * 2048)
    with pytest.raises(ValueError, match="bad.bin is not an llm.c shard: header starts \\[0, 0, 0\\]"):
        llmc.read(str(bad))
    short = tmp_path / "short.bin"
    short.write_bytes(llmc.header(10, 500) + b"\1\0" * 9)
    with pytest.raises(ValueError, match="short.bin is 1042 bytes; its header promises 10 uint16 tokens"):
        llmc.read(str(short), mmap=True)
    with pytest.raises(ValueError, match="holds uint16 tokens .* but the manifest says dtype=uint32"):
        llmc.read(_one_shard(tmp_path), dtype="uint32")


def _one_shard(tmp_path) -> str:
    path = str(tmp_path / "one.bin")
    llmc.write(path, [np.arange(5)], 500)
    return path


def test_an_empty_shard_reads_as_no_tokens(tmp_path):
    path = str(tmp_path / "empty.bin")
    assert llmc.write(path, [], 500) == 0
    assert llmc.read(path).shape == llmc.read(path, mmap=True).shape == (0,)
