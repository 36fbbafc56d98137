"""Training that starts from a Hugging Face Llama checkpoint: `train.Config.init_from`.

    make pipeline OVERRIDES='train.Config.init_from = "/models/my-llama"'   # gs://..., hf://owner/name@<sha>

What happens, and where:
    the model config   is the checkpoint's config.json (`resolve`, called when the gin config is loaded):
                       a train.ModelConfig field gin binds to a different value is an error naming both
    the files          are named by the directory alone: config.json, model.safetensors or the files
                       model.safetensors.index.json's weight_map names, tokenizer.model or tokenizer.json. A
                       name in the index must be a plain file name in the directory: no '..', no absolute
                       path, no sub-directory, no URL (`weight_files`), so a checkpoint never reads, and no
                       key misses, a file outside it
    the cache key      holds init_from and `fingerprint`: each file that is read and its version from one
                       listing (local: size and mtime; gs://: generation; hf://: the blob id), as download
                       keys its files; no other file of the directory counts
    before any stage   `problem` reads every safetensors header (two ranged reads a file, never the weights)
                       and checks it against the file and the model config: train.check, so a damaged or
                       mismatched checkpoint is one line before the data half runs, naming file and tensor
    the tokenizer      must be the one the weights were trained with: `tokenizer_problem` compares the run's
                       sentencepiece pieces with the checkpoint's tokenizer.model (or tokenizer.json's
                       vocabulary) before training starts; to use the checkpoint's own tokenizer, set
                       tokenizer.Config.pretrained to the same directory (the tokenizer stage then copies it)
    the weights        are read by `load_params` shard by shard into the training layout: each device's
                       block of each parameter is cut from the memory-mapped safetensors files (copied to a
                       local temporary directory first when remote), so no host holds the whole model;
                       the optimizer state starts fresh (loop.set_up)
"""

from __future__ import annotations

import json
import logging
import os

import numpy as np

from stages.io import safetensors, storage
from stages.train import hf

log = logging.getLogger(__name__)


CONFIG = "config.json"
TOKENIZER_FILES = ("tokenizer.model", "tokenizer.json")      # the first one present is the one read
FLOATING = ("float32", "bfloat16", "float16", "float64")    # what a weight may be stored as


def model_fields(source: str) -> dict:
    """ModelConfig fields from `source`'s config.json; ValueError naming the file and the setting."""
    path = storage.join(source, CONFIG)
    if not _storage(storage.exists, path):
        offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
        if storage.is_hub(source) and offline:
            # huggingface_hub then answers from its local cache only: "absent", which is not what is wrong
            raise ValueError(f"cannot read {path}: HF_HUB_OFFLINE is set, so the hub is not asked; unset it, "
                             "or download the model and name its local directory")
        raise ValueError(f"train.Config.init_from={source!r} has no {CONFIG} (a Hugging Face model "
                         f"directory: {CONFIG}, *.safetensors, the tokenizer)")
    config = _json(path)
    if not isinstance(config, dict):
        raise ValueError(f"{path} is a JSON {type(config).__name__}, not an object of settings (a Hugging "
                         "Face config.json: model_type, hidden_size, num_attention_heads, ...)")
    return hf.model_fields(config, where=path)


def listing(source: str) -> dict[str, str]:
    """Every file directly in `source` -> its version (storage.versions: one listing, nothing opened)."""
    found = _storage(storage.versions, storage.join(storage.escape(source), "*"))   # `[` in it is literal
    if not found:
        raise ValueError(f"train.Config.init_from={source!r} holds no files")
    return {path.rsplit("/", 1)[-1]: version for path, version in found.items()}


def weight_files(source: str, listed: dict[str, str]) -> list[str]:
    """The names of the checkpoint's safetensors files: those model.safetensors.index.json's weight_map
    names, else model.safetensors; `listed` is `listing(source)`. ValueError naming the index and the name
    when one is not a plain file name in `source` ('..', an absolute path, a sub-directory, a URL) or is
    missing from it."""
    index = storage.join(source, safetensors.INDEX)
    if safetensors.INDEX not in listed:
        if safetensors.SINGLE in listed:
            return [safetensors.SINGLE]
        raise ValueError(f"init_from {source}: no {safetensors.SINGLE} or {safetensors.INDEX} (only "
                         "safetensors weights are read; save with safe_serialization=True)")
    weight_map = weight_map_of(source)
    names = sorted(set(weight_map.values()))
    for name in names:
        if name in ("", ".", "..") or any(c in name for c in "/\\\0"):
            raise ValueError(f"{index} names the weight file {name!r}, which is not a file name in {source}: "
                             "a checkpoint is read from its own directory only (no '..', absolute path, "
                             "sub-directory or URL)")
        if name not in listed:
            held = sorted(listed)
            raise ValueError(f"{index} names the weight file {name!r}, which is not in {source} (it holds "
                             f"{', '.join(held[:8])}{', ...' if len(held) > 8 else ''})")
    return names


def weight_map_of(source: str) -> dict[str, str]:
    """model.safetensors.index.json's weight_map (tensor name -> file name); ValueError naming the file when
    it is not JSON or not such an object."""
    index = storage.join(source, safetensors.INDEX)
    data = _json(index)
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if (not isinstance(weight_map, dict) or not weight_map
            or not all(isinstance(v, str) for v in weight_map.values())):
        raise ValueError(f"{index} has no weight_map of tensor name -> file name (as transformers' "
                         "save_pretrained writes it)")
    return weight_map


def fingerprint(source: str) -> dict[str, str]:
    """Each file of `source` that is read (config.json, the index, the weight files, the tokenizer file) ->
    its version (storage.versions), for the cache key: what the run reads, and nothing else."""
    listed = listing(source)
    if CONFIG not in listed:
        raise ValueError(f"train.Config.init_from={source!r} has no {CONFIG}")
    names = [CONFIG, *[n for n in (safetensors.INDEX,) if n in listed], *weight_files(source, listed),
             *[n for n in TOKENIZER_FILES if n in listed][:1]]
    return {name: listed[name] for name in names}


def problem(source: str, mcfg) -> str:
    """Why the checkpoint at `source` cannot start `mcfg` (the model config resolved from it), in one line
    naming the file and the tensor, or "": every safetensors header is read (its length and JSON only) and
    checked (safetensors.read_specs), every tensor the index maps must be in its file, and every tensor the
    model needs (hf.tensors) must be there with its shape and a floating dtype."""
    try:
        listed = listing(source)
        names = weight_files(source, listed)
        specs = {name: _storage(safetensors.read_specs, storage.join(source, name)) for name in names}
        weight_map = weight_map_of(source) if safetensors.INDEX in listed else {}
    except ValueError as e:
        return str(e)
    for tensor, name in weight_map.items():
        if tensor not in specs[name]:
            return (f"{storage.join(source, safetensors.INDEX)} maps tensor {tensor} to {name}, whose header "
                    "has no such tensor")
    where = {tensor: name for name in names for tensor in specs[name]} | weight_map
    for t in hf.tensors(mcfg):
        if t.name not in where:
            return (f"init_from {source}: tensor {t.name} is in none of its safetensors files "
                    f"({', '.join(names)}); {CONFIG}'s model needs it")
        path, spec = storage.join(source, where[t.name]), specs[where[t.name]][t.name]
        if spec.shape != t.shape:
            return f"{path}: tensor {t.name} is {spec.shape}, the model of {CONFIG} needs {t.shape}"
        if spec.dtype not in FLOATING:
            return f"{path}: tensor {t.name} is {spec.dtype}; a weight is one of {', '.join(FLOATING)}"
    return ""


def resolve(model_config, bound: frozenset[str], source: str):
    """`model_config` with every field config.json expresses taken from `source`; ValueError when a field in
    `bound` (the ModelConfig fields gin set) holds another value, naming both, or when the index names a
    weight file outside `source` (weight_files: so that is found when the config loads, before any key)."""
    import dataclasses

    fields = model_fields(source)
    weight_files(source, listing(source))
    for name, value in fields.items():
        mine = getattr(model_config, name)
        if name in bound and mine != value:
            raise ValueError(f"train.ModelConfig.{name} = {mine!r} (gin) conflicts with {value!r} in "
                             f"{storage.join(source, CONFIG)}; the model config is taken from "
                             "train.Config.init_from: remove the binding")
    try:
        return dataclasses.replace(model_config, **fields)
    except ValueError as e:           # ModelConfig's own checks: say where the values came from
        raise ValueError(f"{e} (from {storage.join(source, CONFIG)})") from None


def tokenizer_problem(sp_model: bytes, source: str) -> str:
    """Why the run's sentencepiece model (`sp_model`) is not the tokenizer of the checkpoint at `source`, in
    one line naming both and the fix, or ""."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_proto=sp_model)
    ours = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    fix = (f"train on the checkpoint's tokenizer with tokenizer.Config.pretrained = {source!r}, or start "
           "from a checkpoint trained with this run's tokenizer")
    model_file, json_file = (storage.join(source, name) for name in TOKENIZER_FILES)
    if storage.exists(model_file):
        theirs_sp = spm.SentencePieceProcessor(model_proto=storage.read_bytes(model_file))
        theirs = [theirs_sp.id_to_piece(i) for i in range(theirs_sp.get_piece_size())]
        where = model_file
    elif storage.exists(json_file):
        vocab = storage.read_json(json_file).get("model", {}).get("vocab", {})
        pairs = vocab.items() if isinstance(vocab, dict) else ((p, i) for i, (p, _) in enumerate(vocab))
        by_id = {i: p for p, i in pairs}
        theirs = [by_id.get(i) for i in range(len(by_id))]
        where = json_file
    else:
        return (f"train.Config.init_from={source!r} has no tokenizer.model or tokenizer.json to check the "
                f"run's tokenizer against; {fix}")
    if ours == theirs:
        return ""
    first = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
    return (f"the run's tokenizer ({len(ours):,} pieces) is not the checkpoint's ({where}: {len(theirs):,} "
            f"pieces; they first differ at id {first}); {fix}")


def tokenizer_files_problem(source: str) -> str:
    """Why the checkpoint at `source` has no tokenizer to check the run's against (`tokenizer_problem` needs
    tokenizer.model or tokenizer.json), in one line, or "": from one listing, before any stage runs."""
    try:
        listed = listing(source)
    except ValueError as e:
        return str(e)
    if any(name in listed for name in TOKENIZER_FILES):
        return ""
    return (f"{source} has no {' or '.join(TOKENIZER_FILES)}: the weights must be trained on with the "
            "tokenizer they learned, and nothing says which that is; copy the checkpoint's tokenizer file "
            "into the directory (save_pretrained writes it)")


def vocab_problem(source: str, run_pieces: int, where: str) -> str:
    """Why the run's tokenizer, of `run_pieces` pieces (`where` says which setting gives that number), cannot
    be the checkpoint's, in one line, or "": a different number of pieces than the checkpoint's tokenizer file
    holds (counted without loading it), known before the data half runs."""
    try:
        listed = listing(source)
        name = next((n for n in TOKENIZER_FILES if n in listed), None)
        if name is None:
            return tokenizer_files_problem(source)
        path = storage.join(source, name)
        theirs = (sentencepiece_pieces(_storage(storage.read_bytes, path), path) if name.endswith(".model")
                  else _json_vocab_size(path))
    except ValueError as e:
        return str(e)
    if theirs == run_pieces:
        return ""
    return (f"the run's tokenizer will have {run_pieces:,} pieces ({where}), the checkpoint's {path} has "
            f"{theirs:,}: the weights embed the checkpoint's pieces. Set tokenizer.Config.pretrained = "
            f"{source!r} to train on its tokenizer")


def sentencepiece_pieces(model: bytes, where: str) -> int:
    """The number of pieces in a serialized sentencepiece ModelProto (its repeated field 1), read from the
    protobuf wire format, so planning needs no sentencepiece; ValueError naming `where` when it is not one."""
    count, at = 0, 0

    def varint() -> int:
        nonlocal at
        value, shift = 0, 0
        while True:
            if at >= len(model) or shift > 63:
                raise ValueError(f"{where} is not a sentencepiece model (a protobuf cut short at byte {at})")
            byte = model[at]
            at += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                return value

    while at < len(model):
        tag = varint()
        field, wire = tag >> 3, tag & 7
        if wire == 0:
            varint()
        elif wire in (1, 5):
            at += 8 if wire == 1 else 4
        elif wire == 2:
            length = varint()          # read first: `at += varint()` would add to `at` as it was before
            at += length
        else:
            raise ValueError(f"{where} is not a sentencepiece model (protobuf wire type {wire} at byte {at})")
        count += field == 1 and wire == 2
    if at != len(model) or not count:
        raise ValueError(f"{where} is not a sentencepiece model (no pieces, or a protobuf cut short)")
    return count


def _json_vocab_size(path: str) -> int:
    """The pieces of a tokenizer.json's model vocabulary (what `tokenizer_problem` compares)."""
    vocab = _json(path)
    vocab = vocab.get("model", {}).get("vocab") if isinstance(vocab, dict) else None
    if not isinstance(vocab, (dict, list)) or not vocab:
        raise ValueError(f"{path} has no model.vocab (a Hugging Face tokenizer.json's pieces)")
    return len(vocab)


def load_params(source: str, mcfg, params):
    """`params` (an nnx State of arrays, placed as training places them) with every value replaced by the
    checkpoint's weights at `source`, each device's block read on its own (`jax.make_array_from_callback`)."""
    import jax

    from stages.train import pytree

    by_param: dict[str, list[hf.Tensor]] = {}
    for t in hf.tensors(mcfg):
        by_param.setdefault(t.param, []).append(t)
    names = weight_files(source, listing(source))
    files = {name: storage.join(source, name) for name in names}
    with storage.local_files(list(files.values())) as local:
        readers = {name: safetensors.Reader(path) for name, path in zip(files, local)}
        arrays = {tensor: r.array(tensor) for r in readers.values() for tensor in r.names()}   # views

        zero = hf.implied_zero(mcfg)

        def load(path, leaf):
            name = ".".join(k for k in pytree.names(path) if k != "value")
            if name in zero:            # a parameter the class fixes at zero (Mixtral's selection bias)
                return jax.make_array_from_callback(
                    leaf.shape, leaf.sharding, lambda index: np.zeros(leaf.shape, leaf.dtype)[index])
            if name not in by_param:
                raise ValueError(f"init_from {source}: no Hugging Face tensor maps to parameter {name!r}")
            parts = {t.index: t for t in by_param[name]}
            for t in parts.values():
                if t.name not in arrays:
                    raise ValueError(f"init_from {source}: tensor {t.name} is missing from its safetensors "
                                     "files")
                if tuple(arrays[t.name].shape) != t.shape:
                    raise ValueError(f"init_from {source}: {t.name} is {tuple(arrays[t.name].shape)}, the "
                                     f"model config needs {t.shape}")

            stacked = len(next(iter(parts))) if None not in parts else 0     # 1: layers, 2: (layer, expert)

            def block(index):          # this device's block of the parameter, in its dtype
                return np.asarray(_block(parts, arrays, index, stacked, leaf.shape), dtype=leaf.dtype)

            return jax.make_array_from_callback(leaf.shape, leaf.sharding, block)

        loaded = jax.tree_util.tree_map_with_path(load, params)
        jax.block_until_ready(loaded)
        for r in readers.values():
            r.close()
    log.info("init_from: %d tensors from %s", sum(len(p) for p in by_param.values()), source)
    return loaded



def _block(parts: dict, arrays: dict, index: tuple, stacked: int, shape: tuple, at: tuple = ()):
    """The block `index` of a parameter made of Hugging Face tensors: `parts` {(layer,) or (layer, expert) or
    None: hf.Tensor}; the first `stacked` axes number the tensors, the rest index into each one."""
    if len(at) == stacked:
        t = parts[at if stacked else None]
        return t.from_hf(arrays[t.name])[index[stacked:]]
    axis = len(at)
    return np.stack([_block(parts, arrays, index, stacked, shape, (*at, i))
                     for i in range(shape[axis])[index[axis]]])


def _storage(call, path: str):
    """`call(path)`, with whatever stops the store (an offline hub, a missing bucket, no permission) as one
    ValueError naming `path` instead of a library's traceback."""
    try:
        return call(path)
    except ValueError:
        raise
    except Exception as e:  # noqa: BLE001 - every way storage fails ends the same: one line, the path
        why = (str(e).strip().splitlines() or [""])[0]
        raise ValueError(f"cannot read {path} ({type(e).__name__}: {why})") from None


def _json(path: str):
    """The JSON in `path`; ValueError naming the file when it cannot be read or is not JSON."""
    raw = _storage(storage.read_bytes, path)
    try:
        return json.loads(raw)
    except ValueError as e:          # JSONDecodeError, UnicodeDecodeError
        raise ValueError(f"{path} is not JSON ({e})") from None
