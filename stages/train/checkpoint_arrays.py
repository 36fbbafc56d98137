"""One array, or one slice of it, read from a finished checkpoint with TensorStore: no JAX, and never more
of the checkpoint in memory than what was asked for (plus the storage chunks it lies in).

    arrays = CheckpointArrays(train.path + "/checkpoint")      # the newest step's "params" item
    arrays.shape("layers.wq")                                 # (L, D, N, H), from the metadata alone
    arrays.read("layers.wq", 3)                               # layer 3 only: (D, N, H) numpy
    arrays.read("moe_layers.experts_up", (2, 5))              # layer 2's expert 5: (D, F) numpy

How checkpoint.py's Orbax saves lay an item out (Orbax 0.12, `StandardSave` with OCDBT): the item directory
is one OCDBT key-value store; each leaf is a zarr array (zarr3 when saved so) under its key path joined with
dots, the bare array of an nnx Param under ".value" ("layers.wq.value"); each saving process wrote its own
shards as chunks. Reading a slice reads only the chunks it overlaps, and TensorStore's chunk cache is off,
so what the export holds at once is one tensor. This knowledge of Orbax's layout lives here, beside the
module that saves (checkpoint.py), and a test reads back what that module wrote.

A stacked parameter is stored one layer per chunk (checkpoint.py), so reading one expert of an MoE layer
decodes the layer's every expert: `read` keeps the last layer it read of each parameter, and a layer's E
experts, read in turn as the export reads them, cost one read of the chunk rather than E. It holds one MoE
layer's expert weights at a time (one layer of each expert parameter), what reading any one expert of each
decodes anyway.
"""

from __future__ import annotations

import tensorstore as ts

from stages.io import storage

PARAMS = "params"


class CheckpointArrays:
    """The arrays of one item (default "params") of the newest step under `directory` (or `step`)."""

    def __init__(self, directory: str, *, step: int | None = None, item: str = PARAMS):
        steps = finished_steps(directory)
        if not steps:
            raise FileNotFoundError(f"{directory} holds no finished checkpoint step")
        if step is not None and step not in steps:
            raise FileNotFoundError(f"{directory} has no checkpoint step {step}; it has {steps}")
        self.step = steps[-1] if step is None else step
        self.path = storage.join(directory, str(self.step), item)
        self._base = storage.tensorstore_kvstore(self.path)
        self._context = ts.Context({"cache_pool": {"total_bytes_limit": 0}})
        store = ts.KvStore.open({"driver": "ocdbt", "base": self._base}, context=self._context).result()
        keys = [k.decode() for k in store.list().result()]
        self._drivers = {k.rsplit("/", 1)[0]: ("zarr3" if k.endswith("/zarr.json") else "zarr")
                         for k in keys if k.endswith(("/.zarray", "/zarr.json"))}
        self._open: dict[str, ts.TensorStore] = {}
        self._layers: dict[str, tuple[int, object]] = {}     # name -> (layer, that layer as numpy): `read`

    def names(self) -> list[str]:
        """The leaves' names: "embed", "layers.wq", ... (an nnx Param's ".value" dropped)."""
        return sorted(k.removesuffix(".value") for k in self._drivers)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._array(name).shape)

    def dtype(self, name: str) -> str:
        return self._array(name).dtype.name

    def read(self, name: str, index: int | tuple[int, ...] | None = None):
        """The array `name` as numpy, or only `array[index]` (one layer of a stacked parameter, or one
        (layer, expert): from the whole layer, kept until another layer of `name` is read)."""
        array = self._array(name)
        if not isinstance(index, tuple) or len(index) < 2:
            return (array if index is None else array[index]).read().result()
        layer = index[0]
        if self._layers.get(name, (None,))[0] != layer:
            self._layers.pop(name, None)                   # the last layer goes before the next is read
            self._layers[name] = (layer, array[layer].read().result())
        return self._layers[name][1][index[1:]]

    def _array(self, name: str) -> ts.TensorStore:
        if name not in self._open:
            key = name if name in self._drivers else f"{name}.value"
            if key not in self._drivers:
                raise KeyError(f"checkpoint {self.path} has no array {name!r}; it has {self.names()}")
            kvstore = {"driver": "ocdbt", "base": self._base, "path": key}
            spec = {"driver": self._drivers[key], "kvstore": kvstore}
            self._open[name] = ts.open(spec, open=True, read=True, context=self._context).result()
        return self._open[name]


def finished_steps(directory: str) -> list[int]:
    """The steps under `directory` that Orbax finished writing (their `_CHECKPOINT_METADATA` is written
    at the commit), in order."""
    if not storage.exists(directory):
        return []
    out = []
    for name in storage.listdir(directory):
        base = name.rstrip("/").rsplit("/", 1)[-1]
        if base.isdigit() and storage.exists(storage.join(directory, base, "_CHECKPOINT_METADATA")):
            out.append(int(base))
    return sorted(out)
