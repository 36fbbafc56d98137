"""Training that starts from a Hugging Face Llama checkpoint: `train.Config.init_from`.

    make pipeline OVERRIDES='train.Config.init_from = "/models/my-llama"'   # or gs://..., hf://owner/name@<sha>

What happens, and where:
    the model config   is the checkpoint's config.json (`resolve`, called when the gin config is loaded):
                       a train.ModelConfig field gin binds to a different value is an error naming both
    the cache key      holds init_from and `fingerprint`: every file of the directory and its version (local:
                       size and mtime; gs://: generation; hf://: the blob id), as download keys its files
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

import logging

import numpy as np

from stages.io import safetensors, storage
from stages.train import hf

log = logging.getLogger(__name__)


def model_fields(source: str) -> dict:
    """ModelConfig fields from `source`'s config.json; ValueError naming the file and the setting."""
    path = storage.join(source, "config.json")
    if not storage.exists(path):
        raise ValueError(f"train.Config.init_from={source!r} has no config.json (a Hugging Face model "
                         "directory: config.json, *.safetensors, the tokenizer)")
    return hf.model_fields(storage.read_json(path), where=path)


def fingerprint(source: str) -> dict[str, str]:
    """Every file directly in `source` -> its version (storage.versions), for the cache key."""
    found = storage.versions(storage.join(source, "*"))
    if not found:
        raise ValueError(f"train.Config.init_from={source!r} holds no files")
    return {path.rsplit("/", 1)[-1]: version for path, version in found.items()}


def resolve(model_config, bound: frozenset[str], source: str):
    """`model_config` with every field config.json expresses taken from `source`; ValueError when a field in
    `bound` (the ModelConfig fields gin set) holds another value, naming both."""
    import dataclasses

    fields = model_fields(source)
    for name, value in fields.items():
        mine = getattr(model_config, name)
        if name in bound and mine != value:
            raise ValueError(f"train.ModelConfig.{name} = {mine!r} (gin) conflicts with {value!r} in "
                             f"{storage.join(source, 'config.json')}; the model config is taken from "
                             "train.Config.init_from: remove the binding")
    return dataclasses.replace(model_config, **fields)


def tokenizer_problem(sp_model: bytes, source: str) -> str:
    """Why the run's sentencepiece model (`sp_model`) is not the tokenizer of the checkpoint at `source`, in
    one line naming both and the fix, or ""."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_proto=sp_model)
    ours = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    fix = (f"train on the checkpoint's tokenizer with tokenizer.Config.pretrained = {source!r}, or start "
           "from a checkpoint trained with this run's tokenizer")
    model_file, json_file = storage.join(source, "tokenizer.model"), storage.join(source, "tokenizer.json")
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


def load_params(source: str, mcfg, params):
    """`params` (an nnx State of arrays, placed as training places them) with every value replaced by the
    checkpoint's weights at `source`, each device's block read on its own (`jax.make_array_from_callback`)."""
    import jax

    from stages.train import pytree

    by_param: dict[str, list[hf.Tensor]] = {}
    for t in hf.tensors(mcfg):
        by_param.setdefault(t.param, []).append(t)
    files = _weight_files(source)
    with storage.local_files(list(files.values())) as local:
        readers = {name: safetensors.Reader(path) for name, path in zip(files, local)}
        arrays = {tensor: r.array(tensor) for r in readers.values() for tensor in r.names()}   # views

        def load(path, leaf):
            name = ".".join(k for k in pytree.names(path) if k != "value")
            if name not in by_param:
                raise ValueError(f"init_from {source}: no Hugging Face tensor maps to parameter {name!r}")
            parts = by_param[name]
            for t in parts:
                if t.name not in arrays:
                    raise ValueError(f"init_from {source}: tensor {t.name} is missing from its safetensors "
                                     "files")
                if tuple(arrays[t.name].shape) != t.shape:
                    raise ValueError(f"init_from {source}: {t.name} is {tuple(arrays[t.name].shape)}, the "
                                     f"model config needs {t.shape}")

            def block(index):          # this device's block of the parameter, in its dtype
                if parts[0].layer is None:
                    out = parts[0].from_hf(arrays[parts[0].name])[index]
                else:
                    layers = range(len(parts))[index[0]]
                    out = np.stack([parts[i].from_hf(arrays[parts[i].name])[index[1:]] for i in layers])
                return np.asarray(out, dtype=leaf.dtype)

            return jax.make_array_from_callback(leaf.shape, leaf.sharding, block)

        loaded = jax.tree_util.tree_map_with_path(load, params)
        jax.block_until_ready(loaded)
        for r in readers.values():
            r.close()
    log.info("init_from: %d tensors from %s", sum(len(p) for p in by_param.values()), source)
    return loaded


def _weight_files(source: str) -> dict[str, str]:
    """File name -> path of the checkpoint's safetensors files (from the index when there is one)."""
    index = storage.join(source, safetensors.INDEX)
    if storage.exists(index):
        names = sorted(set(storage.read_json(index)["weight_map"].values()))
    elif storage.exists(storage.join(source, safetensors.SINGLE)):
        names = [safetensors.SINGLE]
    else:
        raise ValueError(f"init_from {source}: no {safetensors.SINGLE} or {safetensors.INDEX} (only "
                         "safetensors weights are read; save with safe_serialization=True)")
    return {name: storage.join(source, name) for name in names}
