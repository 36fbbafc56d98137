"""The training worker's spec: what `python -m stages.train.worker SPEC` trains, as JSON.

    from stages.train import spec
    spec.write(spec.WorkerSpec(config, shard, out_dir, work_dir, yardsticks), f"{work_dir}/spec.json")
    s = spec.read(f"{work_dir}/spec.json")    # each worker: ValueError naming the file and the field

The training stage writes it into the key's work directory and every training process reads it, on every
host of a TPU slice too (from gs://). Whoever can write that bucket can write the spec, so it is data and
nothing else: JSON whose schema is the dataclasses below, fixed here in code. The decoder rebuilds each
dataclass from its declared fields and checks every value against its field's type; it never creates a
class or calls a function the file names. Unknown, missing or wrongly typed fields are refused.

    {"format": "refinery.train.spec/1",
     "config": {"model": {"vocab_size": 4096, ...}, "optimizer": {...}, ..., "steps": 200, ...},
     "shard": {"stage": "shard", "key": "3f2a...", "path": "gs://b/cache/shard/3f2a.../attempt-...",
               "files": {"manifest.json": 97, "train-00000.bin": 2048}, "manifest": {...}},
     "out_dir": "gs://b/cache/train/<key>/attempt-...", "work_dir": "gs://b/cache/train/<key>/work"}
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from collections.abc import Mapping
from typing import Any

from stages.io import storage
from stages.io.committed import Committed
from stages.train.stage_config import Config

# Bump when the schema changes shape (not when a config gains a field: that is checked field by field).
FORMAT = "refinery.train.spec/2"   # 2: `sources`


@dataclasses.dataclass(frozen=True)
class WorkerSpec:
    config: Config       # the resolved training config: gin never reaches a worker
    shard: Committed     # the shard stage's output, as the cache hands it to the stage
    out_dir: str         # the attempt directory (what the cache commits)
    work_dir: str        # resumable scratch: periodic checkpoints
    yardsticks: Committed | None = None   # the yardsticks stage's output: scored in the loop (loop.py)
    # A mixture's shards, one per source (config.mixture names them); empty for a one-source run, which
    # trains on `shard` (a mixture's `shard` is its first source's, for the vocabulary and the special ids)
    sources: dict[str, Committed] = dataclasses.field(default_factory=dict)


def write(spec: WorkerSpec, path: str) -> None:
    """Writes `spec` to `path` as JSON; TypeError naming the field whose value has no JSON form."""
    text = json.dumps({"format": FORMAT, **encode(spec, WorkerSpec, "")}, indent=1, allow_nan=False)
    storage.write_bytes(path, text.encode())


def read(path: str) -> WorkerSpec:
    """The spec at `path`; ValueError naming the file and the field when it does not match the schema."""
    raw = storage.read_bytes(path)
    try:
        data = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicate_keys,
                          parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError) as e:
        raise ValueError(f"{path} is not a JSON worker spec ({type(e).__name__}: {str(e)[:120]}); "
                         "rerun the training stage to write one") from e
    return decode(data, path)


def decode(data: Any, source: str) -> WorkerSpec:
    """The spec in `data` (parsed JSON); `source` names it in errors."""
    if not isinstance(data, dict):
        raise ValueError(f"{source}: a worker spec is a JSON object, not {_kind(data)}")
    if data.get("format") != FORMAT:
        raise ValueError(f"{source}: format={data.get('format')!r}, but this worker reads {FORMAT!r}; "
                         "rerun the training stage with this checkout to rewrite the spec")
    fields = {k: v for k, v in data.items() if k != "format"}
    return decode_as(fields, WorkerSpec, "", source)


# ------------------------------------------------------------------------------ by the declared types

def encode(value: Any, tp: Any, where: str) -> Any:
    """`value` as JSON by its schema type `tp`. A dataclass is written by the fields of `tp` (so a
    subclass is written as the class its field declares); TypeError naming the field for a value that
    does not have the type its field declares."""
    inner = _optional(tp)
    if inner is not None:
        return None if value is None else encode(value, inner, where)
    if dataclasses.is_dataclass(tp):
        names = [f.name for f in dataclasses.fields(tp) if f.init]
        if dataclasses.is_dataclass(value) and {f.name for f in dataclasses.fields(value)} != set(names):
            raise TypeError(f"{where or 'spec'}: a {type(value).__name__} does not have the fields of "
                            f"{tp.__name__} ({names}); the spec would lose some")
        hints = typing.get_type_hints(tp)
        return {n: encode(getattr(value, n), hints[n], _at(where, n)) for n in names}
    if tp is Any:
        return value   # plain JSON data (a manifest): json.dumps refuses anything else
    if not _fits(value, tp, tuple, where):
        raise TypeError(f"{where} = {_kind(value)}, but the field is {_name(tp)}")
    if isinstance(value, tuple):
        return [encode(v, t, f"{where}[{i}]") for i, (v, t) in enumerate(zip(value, _item_types(tp, value)))]
    if isinstance(value, Mapping):
        return {k: encode(v, typing.get_args(tp)[1], f"{where}[{k!r}]") for k, v in value.items()}
    return value


def decode_as(value: Any, tp: Any, where: str, source: str) -> Any:
    """`value` (parsed JSON) rebuilt as the schema type `tp`: dataclasses by their declared fields, tuples
    from lists; ValueError naming `source` and the field `where` for anything else."""
    inner = _optional(tp)
    if inner is not None:
        return None if value is None else decode_as(value, inner, where, source)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ValueError(f"{source}: {where} = {_kind(value)}, but the field is a JSON object "
                             f"({tp.__name__})")
        names = [f.name for f in dataclasses.fields(tp) if f.init]
        unknown = [n for n in value if n not in names]
        missing = [n for n in names if n not in value]
        if unknown:
            raise ValueError(f"{source}: {_at(where, unknown[0])} is not a field of {tp.__name__}; "
                             f"its fields are {names}")
        if missing:
            raise ValueError(f"{source}: {_at(where, missing[0])} is missing ({tp.__name__} needs every "
                             "field: the spec is written whole)")
        hints = typing.get_type_hints(tp)
        kwargs = {n: decode_as(value[n], hints[n], _at(where, n), source) for n in names}
        try:
            return tp(**kwargs)
        except (TypeError, ValueError) as e:    # the config's own checks (__post_init__)
            raise ValueError(f"{source}: {where or 'spec'}: {e}") from e
    if tp is Any:
        return value   # json.loads made it: only dicts, lists, strings, numbers, booleans and null
    if not _fits(value, tp, list, where):     # JSON has no tuples: a tuple field arrives as a list
        raise ValueError(f"{source}: {where} = {_kind(value)}, but the field is {_name(tp)}")
    if isinstance(value, list):
        return tuple(decode_as(v, t, f"{where}[{i}]", source)
                     for i, (v, t) in enumerate(zip(value, _item_types(tp, value))))
    if isinstance(value, dict):
        return {k: decode_as(v, typing.get_args(tp)[1], f"{where}[{k!r}]", source) for k, v in value.items()}
    return value


def _fits(value: Any, tp: Any, sequence: type, where: str) -> bool:
    """Whether `value` has the shape of `tp`: a bool is not an int here, an int is a float (as in Python's
    annotations), and a float is finite (JSON has no NaN)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is tuple:
        return isinstance(value, sequence) and (Ellipsis in args or len(value) == len(args))
    if origin is dict and args[0] is str:
        return isinstance(value, Mapping) and all(isinstance(k, str) for k in value)
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp in (str, bool):
        return isinstance(value, tp)
    raise TypeError(f"{where}: the spec has no JSON form for type {_name(tp)}; "
                    "add one to stages/train/spec.py")


def _optional(tp: Any) -> Any:
    """X for `X | None` (or Optional[X]), else None."""
    args = typing.get_args(tp)
    if typing.get_origin(tp) in (typing.Union, types.UnionType) and len(args) == 2 and type(None) in args:
        return next(a for a in args if a is not type(None))
    return None


def _item_types(tp: Any, value: Any) -> list[Any]:
    args = typing.get_args(tp)
    return [args[0]] * len(value) if Ellipsis in args else list(args)


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # json.loads would keep the last of two equal keys silently; a spec that says a field twice is refused.
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"the key {k!r} appears twice in one object")
        out[k] = v
    return out


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _at(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name


def _name(tp: Any) -> str:
    return tp.__name__ if isinstance(tp, type) else str(tp)


def _kind(value: Any) -> str:
    return f"{type(value).__name__} {repr(value)[:80]}"
