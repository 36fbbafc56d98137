"""The safetensors format (what Hugging Face models are stored in), written one tensor at a time and read
memory-mapped, with numpy only: no torch, no `safetensors` package.

    specs = [Spec("model.embed_tokens.weight", (V, D), "float32"), ...]
    safetensors.write("out/model.safetensors", specs, lambda spec: array_for(spec.name),
                      metadata={"format": "pt"})      # each array is asked for, written and dropped in turn
    with safetensors.Reader("out/model.safetensors") as f:
        f.names(); f.spec("model.norm.weight"); f.array("model.norm.weight")   # a read-only memory map
    safetensors.read_specs("gs://b/model.safetensors")    # {name: Spec}: the header alone, by ranged reads

The file: 8 bytes (little-endian u64) giving the header's length, the header (JSON: name -> dtype, shape,
data_offsets [begin, end) relative to the data that follows; "__metadata__": str -> str), padded with spaces
to a multiple of 8 bytes, then the tensors' bytes, row-major, little-endian, in the header's offset order.
Because every offset follows from the shapes and dtypes, the header is written first and a model never
has to be held whole: peak memory is one tensor (`write`). `plan_shards` splits a model's tensors into files
under a size limit, as `save_pretrained` does, with the index (`model.safetensors.index.json`) that names
each tensor's file.

A file from outside (train.Config.init_from) is trusted for nothing: `parse_header` checks the length
against the file's size and a limit, that the header is a UTF-8 JSON object, that every dtype is one this
module reads, and that every tensor's data_offsets lie inside the data and span exactly dtype x shape
bytes without overlapping another's, and raises ValueError naming the file and the tensor. `read_specs`
does this for any storage path by reading only the first 8 + header-length bytes, so a checkpoint of
hundreds of gigabytes is checked before any work for the price of two small reads a file.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import struct
from collections.abc import Callable, Iterable, Mapping

import ml_dtypes
import numpy as np

from stages.io import storage

# numpy dtype name -> safetensors dtype name (bfloat16 through ml_dtypes, which numpy reads and writes)
DTYPES = {"float32": "F32", "bfloat16": "BF16", "float16": "F16", "float64": "F64", "int32": "I32",
          "int64": "I64", "int8": "I8", "uint8": "U8", "bool": "BOOL"}
_NUMPY = {v: k for k, v in DTYPES.items()}
INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
# The safetensors library's own limit on a header (its MAX_HEADER_SIZE): a length above it is damage, and
# reading it would ask for that much memory (a header length of 2^62 was a MemoryError).
MAX_HEADER_BYTES = 100_000_000


@dataclasses.dataclass(frozen=True)
class Spec:
    """One tensor to write: its name in the file, shape and numpy dtype name (a key of DTYPES)."""

    name: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * numpy_dtype(self.dtype).itemsize


def numpy_dtype(name: str) -> np.dtype:
    if name not in DTYPES:
        raise ValueError(f"dtype {name!r} has no safetensors spelling; supported: {', '.join(DTYPES)}")
    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


def header(specs: Iterable[Spec], metadata: Mapping[str, str] | None = None) -> bytes:
    """The 8-byte length and the padded JSON header for `specs`, laid out in the order given."""
    entries: dict = {"__metadata__": dict(metadata)} if metadata else {}
    offset = 0
    for s in specs:
        if s.name in entries:
            raise ValueError(f"tensor name {s.name!r} appears twice")
        entries[s.name] = {"dtype": DTYPES[s.dtype], "shape": list(s.shape),
                           "data_offsets": [offset, offset + s.nbytes]}
        offset += s.nbytes
    text = json.dumps(entries, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


def write(path: str, specs: list[Spec], array_for: Callable[[Spec], np.ndarray],
          metadata: Mapping[str, str] | None = None) -> None:
    """Writes `specs` to `path` (local or gs://), asking `array_for(spec)` for each tensor in turn and
    dropping it once written: memory holds one tensor at a time. An array whose shape or dtype is not its
    spec's is an error naming the tensor (the header already promised its size)."""
    with storage.open(path, "wb") as f:
        f.write(header(specs, metadata))
        for spec in specs:
            array = array_for(spec)
            if tuple(array.shape) != tuple(spec.shape) or array.dtype != numpy_dtype(spec.dtype):
                raise ValueError(f"{path}: tensor {spec.name} is {array.dtype}{list(array.shape)}, the "
                                 f"header says {spec.dtype}{list(spec.shape)}")
            data = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))   # a copy only if needed
            f.write(data.reshape(-1).view(np.uint8).data)
            del array, data


def plan_shards(specs: list[Spec], max_bytes: int) -> list[list[Spec]]:
    """`specs` in order, cut into consecutive files of at most `max_bytes` each (a tensor larger than the
    limit gets a file of its own, as transformers does)."""
    if max_bytes < 1:
        raise ValueError(f"max_bytes={max_bytes} must be >= 1")
    files: list[list[Spec]] = [[]]
    size = 0
    for s in specs:
        if files[-1] and size + s.nbytes > max_bytes:
            files.append([])
            size = 0
        files[-1].append(s)
        size += s.nbytes
    return files


def shard_names(n: int) -> list[str]:
    """transformers' file names: model.safetensors alone, else model-00001-of-00003.safetensors, ..."""
    return [SINGLE] if n == 1 else [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]


def index(files: list[list[Spec]]) -> dict:
    """The index that names each tensor's file (written only when there are several files)."""
    names = shard_names(len(files))
    return {"metadata": {"total_size": sum(s.nbytes for group in files for s in group)},
            "weight_map": {s.name: names[i] for i, group in enumerate(files) for s in group}}


def read_specs(path: str) -> dict[str, Spec]:
    """Every tensor's Spec from the header of the safetensors file at `path` (local, gs://, hf://), checked
    as `parse_header` checks it; reads the 8-byte length and the header, never the tensors."""
    fs, p = storage.filesystem(path)
    size = fs.size(p)
    head = fs.cat_file(p, start=0, end=min(size, 8))
    n = header_length(path, head, size)
    _, entries = parse_header(path, fs.cat_file(p, start=8, end=8 + n), size)
    return {name: Spec(name, tuple(e["shape"]), _NUMPY[e["dtype"]]) for name, e in entries.items()}


def header_length(path: str, first: bytes, size: int) -> int:
    """The header length that the file's first 8 bytes (`first`) give, checked against the file's `size`;
    ValueError naming `path` when the file cannot hold it."""
    if size < 8 or len(first) < 8:
        raise ValueError(f"{path}: {size} bytes, too short for the 8-byte header length of a safetensors "
                         "file (truncated, or not safetensors)")
    (n,) = struct.unpack("<Q", first[:8])
    if n > size - 8:
        raise ValueError(f"{path}: its header length {n:,} runs past the end of the file ({size:,} bytes): "
                         "truncated, or not a safetensors file")
    if n > MAX_HEADER_BYTES:
        raise ValueError(f"{path}: its header length {n:,} is over the {MAX_HEADER_BYTES:,} bytes any "
                         "safetensors header may have: damaged, or not a safetensors file")
    if n < 2:
        raise ValueError(f"{path}: its header length {n} cannot hold a JSON object: not a safetensors file")
    return n


def parse_header(path: str, raw: bytes, size: int) -> tuple[dict, dict[str, dict]]:
    """(metadata, {tensor name: entry}) from the header bytes `raw` of the `size`-byte file `path`, every
    entry checked (dtype known, shape of non-negative ints, data_offsets inside the data, spanning dtype x
    shape, overlapping no other tensor); ValueError naming the file and the tensor."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: its header is not UTF-8 (byte {e.start} of {len(raw)}): damaged, or not "
                         "a safetensors file") from None
    try:
        head = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: its header is not JSON ({e.msg} at character {e.pos}): damaged, or not a "
                         "safetensors file") from None
    if not isinstance(head, dict):
        raise ValueError(f"{path}: its header is a JSON {type(head).__name__}, not an object of tensors")
    metadata = head.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict):
        raise ValueError(f"{path}: its __metadata__ is a JSON {type(metadata).__name__}, not an object")
    data = size - 8 - len(raw)
    spans = []
    for name, e in head.items():
        where = f"{path}: tensor {name}"
        if not isinstance(e, dict):
            raise ValueError(f"{where}: its header entry is {e!r}, not {{dtype, shape, data_offsets}}")
        if not isinstance(e.get("dtype"), str) or e["dtype"] not in _NUMPY:
            raise ValueError(f"{where} has dtype {e.get('dtype')!r}, not one of {', '.join(sorted(_NUMPY))}")
        shape, offsets = e.get("shape"), e.get("data_offsets")
        if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
            raise ValueError(f"{where} has shape {shape!r}, not a list of non-negative integers")
        if (not isinstance(offsets, list) or len(offsets) != 2 or not all(type(o) is int for o in offsets)
                or not 0 <= offsets[0] <= offsets[1]):
            raise ValueError(f"{where} has data_offsets {offsets!r}, not [begin, end] with 0 <= begin <= end")
        if offsets[1] > data:
            raise ValueError(f"{where} has data_offsets {offsets} past the end of the file's {data:,} bytes "
                             "of data (truncated?)")
        need = Spec(name, tuple(shape), _NUMPY[e["dtype"]]).nbytes
        if offsets[1] - offsets[0] != need:
            raise ValueError(f"{where} spans {offsets[1] - offsets[0]:,} bytes (data_offsets {offsets}); "
                             f"{e['dtype']}{shape} needs {need:,}")
        spans.append((offsets[0], offsets[1], name))
    spans.sort()
    for (_, end, first), (begin, _, second) in zip(spans, spans[1:]):
        if begin < end:
            raise ValueError(f"{path}: tensor {second}'s data overlaps tensor {first}'s")
    return metadata, head


class Reader:
    """A local safetensors file, memory-mapped: `array(name)` reads only that tensor's pages. The header is
    checked as `parse_header` checks it when the file is opened."""

    def __init__(self, path: str):
        self.path = storage.local_path(path)
        size = os.path.getsize(self.path)
        with open(self.path, "rb") as f:
            n = header_length(self.path, f.read(8), size)
            self.metadata, head = parse_header(self.path, f.read(n), size)
        self._entries = head
        self._map = np.memmap(self.path, dtype=np.uint8, mode="r", offset=8 + n) if head else None

    def names(self) -> list[str]:
        return sorted(self._entries)

    def spec(self, name: str) -> Spec:
        e = self._entry(name)
        if e["dtype"] not in _NUMPY:
            raise ValueError(f"{self.path}: tensor {name} has dtype {e['dtype']}, not one of "
                             f"{sorted(_NUMPY)}")
        return Spec(name, tuple(e["shape"]), _NUMPY[e["dtype"]])

    def array(self, name: str) -> np.ndarray:
        """The tensor as a read-only array backed by the file."""
        spec, (begin, end) = self.spec(name), self._entry(name)["data_offsets"]
        if end - begin != spec.nbytes:
            raise ValueError(f"{self.path}: tensor {name} spans {end - begin} bytes, its shape and dtype "
                             f"need {spec.nbytes}")
        return self._map[begin:end].view(numpy_dtype(spec.dtype).newbyteorder("<")).reshape(spec.shape)

    def _entry(self, name: str) -> dict:
        if name not in self._entries:
            some = ", ".join(sorted(self._entries)[:8]) + (", ..." if len(self._entries) > 8 else "")
            raise KeyError(f"{self.path} has no tensor {name!r}; it has {len(self._entries)}: {some}")
        return self._entries[name]

    def close(self) -> None:
        self._map = None

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
