"""The llm.c token shard format: a header of 256 little-endian int32, then the tokens.

    header[0] = magic, header[1] = version, header[2] = number of tokens, the rest 0
    uint16 tokens, magic 20240520, version 1  when every id fits (vocab_size <= 65536)
    uint32 tokens, magic 20240801, version 7  otherwise (llm.c's format for larger vocabularies)

    llmc.write("train-00000.bin", [tokens_a, tokens_b], vocab_size)   # one shard from pieces; any storage
    tokens = llmc.read("train-00000.bin")                # np.ndarray (N,) uint16 or uint32; a local file
    tokens = llmc.read("train-00000.bin", mmap=True)     # the same, memory-mapped (training)

The one writer and the one reader of the format: the shard stage writes, training and evaluation read.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from stages.io import storage

HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
# magic -> (version, token dtype)
FORMATS = {20240520: (1, np.dtype("<u2")), 20240801: (7, np.dtype("<u4"))}
MAX_TOKENS = 2**31 - 1        # header[2] is an int32


def magic_for(vocab_size: int) -> int:
    return 20240520 if vocab_size <= 2**16 else 20240801


def dtype_for(vocab_size: int) -> np.dtype:
    return FORMATS[magic_for(vocab_size)][1]


def header(num_tokens: int, vocab_size: int) -> bytes:
    if not 0 <= num_tokens <= MAX_TOKENS:
        raise ValueError(f"an llm.c shard holds at most {MAX_TOKENS} tokens, not {num_tokens}")
    magic = magic_for(vocab_size)
    h = np.zeros(HEADER_INTS, dtype="<i4")
    h[:3] = magic, FORMATS[magic][0], num_tokens
    return h.tobytes()


def write(path: str, pieces: Sequence[np.ndarray], vocab_size: int) -> int:
    """Writes the concatenation of `pieces` (1-D token arrays) as one shard; returns its token count.

    The pieces are streamed one after the other, so a shard is never held in memory twice.
    """
    dtype = dtype_for(vocab_size)
    num_tokens = sum(len(p) for p in pieces)
    with storage.open(path, "wb") as f:
        f.write(header(num_tokens, vocab_size))
        for p in pieces:
            f.write(np.ascontiguousarray(p, dtype=dtype).tobytes())
    return num_tokens


def read(filename: str, *, mmap: bool = False, dtype: np.dtype | str | None = None) -> np.ndarray:
    """The tokens of a local shard file, checked against its header and size.

    mmap=True maps them instead of reading (training reads windows of shards larger than memory).
    `dtype`, when given (the shard manifest's), must be the one the header's magic implies.
    Returns (N,) uint16 or uint32.
    """
    size = os.path.getsize(filename)
    if size < HEADER_BYTES:   # else the check below would name a cut header's first ints as a wrong magic
        raise ValueError(f"{filename} is {size} bytes, shorter than the {HEADER_BYTES}-byte llm.c header: "
                         "truncated, or not a token shard")
    h = np.fromfile(filename, dtype="<i4", count=HEADER_INTS)
    if int(h[0]) not in FORMATS or FORMATS[int(h[0])][0] != h[1]:
        raise ValueError(f"{filename} is not an llm.c shard: header starts {h[:3].tolist()}, expected "
                         f"magic/version in {[(m, v) for m, (v, _) in FORMATS.items()]}")
    stored, count = FORMATS[int(h[0])][1], int(h[2])
    if dtype is not None and np.dtype(dtype).newbyteorder("<") != stored:
        raise ValueError(f"{filename} holds {stored.name} tokens (magic {int(h[0])}) but the manifest says "
                         f"dtype={np.dtype(dtype).name}")
    if size != HEADER_BYTES + count * stored.itemsize:
        raise ValueError(f"{filename} is {size} bytes; its header promises {count} {stored.name} tokens "
                         f"after {HEADER_BYTES} header bytes = {HEADER_BYTES + count * stored.itemsize}")
    if count == 0:
        return np.zeros(0, stored)          # np.memmap refuses an empty map
    if mmap:
        return np.memmap(filename, dtype=stored, mode="r", offset=HEADER_BYTES, shape=(count,))
    return np.fromfile(filename, dtype=stored, offset=HEADER_BYTES)


def file_size(num_tokens: int, vocab_size: int) -> int:
    return HEADER_BYTES + num_tokens * dtype_for(vocab_size).itemsize
