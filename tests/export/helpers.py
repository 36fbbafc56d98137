"""A model exported as the export stage exports a trained one, from parameters a test chose: the checkpoint
written by the training stage's Checkpointer, the summary.json, shard manifest and tokenizer it reads."""

from __future__ import annotations

import dataclasses
import io
import json
import pathlib

import sentencepiece as spm

from stages import export
from stages import tokenizer as tokenizer_stage
from stages.io import storage
from stages.io.committed import Committed

TEXT = ("The quick brown fox jumps over the lazy dog. A stitch in time saves nine. " * 40 +
        "Numbers 0123456789 and punctuation: (a), [b], {c}!\n")


def tokenizer_model(vocab_size: int = 320) -> bytes:
    out = io.BytesIO()
    cfg = tokenizer_stage.Config(vocab_size=vocab_size)
    spm.SentencePieceTrainer.train(sentence_iterator=iter(TEXT.split(". ")), model_writer=out,
                                   **tokenizer_stage.trainer_options(cfg) | {"hard_vocab_limit": False})
    return out.getvalue()


def committed(stage: str, directory: pathlib.Path, manifest: dict | None = None) -> Committed:
    files = {str(p.relative_to(directory)): p.stat().st_size for p in directory.rglob("*") if p.is_file()}
    return Committed(stage, f"{stage}-key", str(directory), files, manifest or {})


def write_train(directory: pathlib.Path, mcfg, params) -> Committed:
    """A train output holding `params` (an nnx.State) as checkpoint step 1 and the summary naming mcfg."""
    import jax.numpy as jnp

    from stages.train import checkpoint

    ckpt = checkpoint.Checkpointer(str(directory / "checkpoint"), keep=1, every=1, async_save=False)
    ckpt.save(1, {"params": params, "step": jnp.int32(1)}, force=True)
    ckpt.close()
    (directory / "summary.json").write_text(json.dumps({"model": dataclasses.asdict(mcfg)}))
    return committed("train", directory)


def write_inputs(tmp: pathlib.Path, mcfg, params, sp_model: bytes) -> dict[str, Committed]:
    """The export's inputs under `tmp` (train/, tokenizer/, shard/): `params` as train's checkpoint."""
    train = write_train(tmp / "train", mcfg, params)
    (tmp / "tokenizer").mkdir()
    (tmp / "tokenizer" / "tokenizer.model").write_bytes(sp_model)
    (tmp / "shard").mkdir()
    storage.write_json(str(tmp / "shard" / "manifest.json"), {"bos_id": 1, "eos_id": 2, "add_bos": False})
    return {"train": train, "tokenizer": committed("tokenizer", tmp / "tokenizer"),
            "shard": committed("shard", tmp / "shard")}


def export_model(tmp: pathlib.Path, mcfg, params, sp_model: bytes, config=None) -> pathlib.Path:
    """Runs the export stage (default config) on `params` and returns its output directory."""
    inputs = write_inputs(tmp, mcfg, params, sp_model)
    out = tmp / "export"
    export.run(config or export.Config(), inputs, str(out), str(tmp / "work"))
    return out


def greedy_both(net, export_dir, prompt_tokens: int = 520, new_tokens: int = 24) -> tuple[list, list]:
    """(ours, transformers') greedy continuations of one random prompt: the JAX model `net` (KV-cache
    decoding, stages/evaluate/measure.py) and the export at `export_dir` loaded by transformers."""
    import numpy as np
    import torch
    import transformers

    from stages.evaluate import measure

    theirs_model = transformers.AutoModelForCausalLM.from_pretrained(export_dir, dtype=torch.float32).eval()
    prompt = list(np.random.default_rng(2).integers(3, 300, size=prompt_tokens))
    ours = measure._generate(net, prompt, new_tokens, temperature=0.0, top_k=0, seed=0)
    with torch.no_grad():
        theirs = theirs_model.generate(torch.tensor([prompt]), max_new_tokens=new_tokens, do_sample=False,
                                       eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()
    return ours, theirs


def reexports_identically(first: pathlib.Path, cfg, params, sp_model: bytes, fields) -> None:
    """`first` (an export of `cfg`'s `params`) read back by init_from: its config's `fields` equal cfg's, the
    parameters equal `params` to the bit, and exporting them again writes the same safetensors bytes."""
    import jax
    import numpy as np
    from flax import nnx

    from stages.train import init_from, model
    from stages.train.model_config import ModelConfig

    loaded_cfg = ModelConfig(**init_from.model_fields(str(first)), dtype="float32")
    for field in fields:
        assert getattr(loaded_cfg, field) == getattr(cfg, field), field
    fresh = nnx.split(model.Transformer(loaded_cfg, rngs=nnx.Rngs(5)), nnx.Param)[1]
    loaded = init_from.load_params(str(first), loaded_cfg, fresh)
    for path, value in jax.tree_util.tree_leaves_with_path(params):
        got = dict(jax.tree_util.tree_leaves_with_path(loaded))[path]
        assert np.array_equal(np.asarray(got), np.asarray(value)), jax.tree_util.keystr(path)
    second = export_model(first.parent / f"{first.name}-again", loaded_cfg, loaded, sp_model)
    assert (first / "model.safetensors").read_bytes() == (second / "model.safetensors").read_bytes()


def transformers_logits_match(net, out: pathlib.Path, vocab_size: int, prompt: int, name: str):
    """The export in `out` loaded by transformers (no missing, unexpected or mismatched keys) gives `net`'s
    logits on a `prompt`-token prompt within 1e-4; returns transformers' model."""
    import jax.numpy as jnp
    import numpy as np
    import torch
    import transformers

    theirs_model, info = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32,
                                                                          output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    ids = np.random.default_rng(1).integers(3, 300, size=(1, prompt))
    with torch.no_grad():
        theirs = theirs_model.eval()(torch.tensor(ids)).logits.numpy()
    hidden, _ = net(jnp.asarray(ids, jnp.int32))
    ours = np.asarray(net.logits(hidden))
    assert theirs.shape == ours.shape == (1, prompt, vocab_size)
    assert np.abs(theirs).max() > 0.5
    delta = np.abs(ours - theirs).max()
    print(f"{name}: max |logit delta| {delta:.2e}, {prompt} positions, largest {np.abs(theirs).max():.1f}")
    assert delta <= 1e-4, name
    return theirs_model
