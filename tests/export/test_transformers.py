"""The export judged by transformers' own PyTorch modeling code (LlamaForCausalLM), not ours: next-token
logits on a 600-token prompt in float32 within 1e-4 of the JAX model's, for the tiny model, GQA, tied and
untied embeddings, a padded vocabulary and each RoPE scaling; greedy generation token for token."""

import dataclasses
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402

from stages.train import model  # noqa: E402
from stages.train.model_config import ModelConfig  # noqa: E402
from tests.export import helpers  # noqa: E402

PROMPT = 600
TINY = ModelConfig(vocab_size=320, d_model=64, n_layers=2, n_heads=4, n_kv_heads=4, max_seq_len=1024,
                   dtype="float32", init_std=0.1)
VARIANTS = {
    "tiny": TINY,
    # gin/model/tiny.gin's architecture (what make pipeline trains), with room for the long prompt
    "tiny_gin": dataclasses.replace(TINY, d_model=128, n_layers=4, n_heads=4, n_kv_heads=2, mlp_dim=384),
    "gqa": dataclasses.replace(TINY, n_heads=8, n_kv_heads=2),
    "tied": dataclasses.replace(TINY, tie_embeddings=True, n_kv_heads=1),
    "padded_vocab": dataclasses.replace(TINY, vocab_size=384),
    "llama3": dataclasses.replace(TINY, rope_scaling="llama3", rope_factor=8.0, rope_original_max_len=128,
                                  rope_theta=500_000.0),
    # theta 500 and head dim 16 put YaRN's correction range past head_dim / 2 - 1: the clip there matters
    "yarn": dataclasses.replace(TINY, rope_scaling="yarn", rope_factor=4.0, rope_original_max_len=2048,
                                max_seq_len=8192, rope_theta=500.0, d_model=64, n_heads=4, head_dim=16),
    "linear": dataclasses.replace(TINY, rope_scaling="linear", rope_factor=4.0),
    "ntk": dataclasses.replace(TINY, rope_scaling="ntk", rope_factor=4.0),
}


@pytest.fixture(scope="module")
def sp_model():
    return helpers.tokenizer_model()


def _jax_model(cfg, seed=0):
    net = model.Transformer(cfg, rngs=nnx.Rngs(seed))
    return net, nnx.split(net, nnx.Param)[1]


@pytest.mark.parametrize("name", list(VARIANTS))
def test_logits_match_transformers_on_a_long_prompt(tmp_path, sp_model, name):
    cfg = VARIANTS[name]
    net, params = _jax_model(cfg)
    out = helpers.export_model(tmp_path, cfg, params, sp_model)
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert type(hf).__name__ == "LlamaForCausalLM"
    ids = np.random.default_rng(1).integers(3, 300, size=(1, PROMPT))
    with torch.no_grad():
        theirs = hf(torch.tensor(ids)).logits.numpy()                   # (1, T, V)
    hidden, _ = net(jnp.asarray(ids, jnp.int32))
    ours = np.asarray(net.logits(hidden))
    assert theirs.shape == ours.shape == (1, PROMPT, cfg.vocab_size)
    assert np.abs(theirs).max() > 0.5              # logits large enough for a wrong rotation to show
    delta = np.abs(ours - theirs).max()
    print(f"{name}: max |logit delta| {delta:.2e}, {PROMPT} positions, largest {np.abs(theirs).max():.1f}")
    assert delta <= 1e-4, name


def test_greedy_generation_matches_token_for_token(tmp_path, sp_model):
    cfg = VARIANTS["gqa"]
    net, params = _jax_model(cfg, seed=3)
    ours, theirs = helpers.greedy_both(net, helpers.export_model(tmp_path, cfg, params, sp_model))
    assert len(set(ours)) > 1                      # not a constant sequence that any model could match
    assert ours == theirs


def test_files_tokenizer_and_card(tmp_path, sp_model):
    cfg = VARIANTS["llama3"]
    _, params = _jax_model(cfg)
    out = helpers.export_model(tmp_path, cfg, params, sp_model)
    config = json.loads((out / "config.json").read_text())
    assert config["rope_parameters"]["rope_type"] == "llama3"
    assert config["rope_scaling"] == config["rope_parameters"]
    loaded = transformers.AutoConfig.from_pretrained(out)
    assert loaded.rope_parameters["rope_type"] == "llama3" and loaded.rope_parameters["factor"] == 8.0
    tok = transformers.AutoTokenizer.from_pretrained(out)
    import sentencepiece as spm
    sp = spm.SentencePieceProcessor(model_proto=sp_model)
    text = "The quick brown fox, 2024 times.\nA stitch in time"
    # every encoding starts with what training put before a document (the EOS: the shards add no BOS)
    assert tok(text).input_ids == [sp.eos_id()] + sp.encode(text)
    assert tok(text, add_special_tokens=False).input_ids == sp.encode(text)
    assert tok.decode(sp.encode(text)) == text
    assert tok.decode(tok(text).input_ids, skip_special_tokens=True) == text
    assert "| train | `train-key` |" in (out / "README.md").read_text()


def test_sharded_files_with_an_index_load_as_one(tmp_path, sp_model):
    cfg = VARIANTS["tiny"]
    net, params = _jax_model(cfg)
    from stages import export
    out = helpers.export_model(tmp_path, cfg, params, sp_model, export.Config(max_shard_bytes=100_000))
    index = json.loads((out / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 3 and files[0] == f"model-00001-of-{len(files):05d}.safetensors"
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    theirs = hf.state_dict()["model.layers.1.mlp.down_proj.weight"].numpy()
    assert np.array_equal(theirs, np.asarray(params["layers"]["w_down"][...])[1].T)


def test_a_bfloat16_export_holds_the_weights_rounded_to_bfloat16(tmp_path, sp_model):
    from stages import export

    cfg = VARIANTS["gqa"]
    _, params = _jax_model(cfg)
    out = helpers.export_model(tmp_path, cfg, params, sp_model, export.Config(dtype="bfloat16"))
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "bfloat16"
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.bfloat16)
    theirs = hf.state_dict()["model.layers.1.self_attn.k_proj.weight"].float().numpy()      # (K * H, D)
    ours = np.asarray(params["layers"]["wk"][...])[1]                                        # (D, K, H)
    expected = np.asarray(jnp.asarray(ours.reshape(cfg.d_model, -1).T, jnp.bfloat16).astype(jnp.float32))
    assert theirs.dtype == np.float32 and np.array_equal(theirs, expected)
    assert not np.array_equal(theirs, ours.reshape(cfg.d_model, -1).T)     # rounded, not float32


def test_a_setting_llama_lacks_fails_naming_it(monkeypatch):
    from stages.train import hf
    monkeypatch.setattr(hf, "EXPRESSED", tuple(f for f in hf.EXPRESSED if f != "norm_eps"))
    with pytest.raises(ValueError, match=r"train.ModelConfig.norm_eps=0.001 has no equivalent"):
        hf.config_json(dataclasses.replace(TINY, norm_eps=1e-3), bos_id=1, eos_id=2, dtype="float32")


@pytest.mark.gcs
def test_an_export_from_and_to_gcs_is_the_local_export(tmp_path, sp_model, gcs_bucket):
    """Checkpoint on gs:// (read by TensorStore through the emulator), output to gs:// (streamed): the
    same files, byte for byte, as the export of the same parameters on local disk."""
    from stages import export
    from stages.io import storage
    from stages.train import checkpoint

    cfg = VARIANTS["gqa"]
    _, params = _jax_model(cfg)
    local = helpers.export_model(tmp_path / "local", cfg, params, sp_model)
    train_dir = f"{gcs_bucket}/train"
    ckpt = checkpoint.Checkpointer(f"{train_dir}/checkpoint", keep=1, every=1, async_save=False)
    ckpt.save(1, {"params": params, "step": jnp.int32(1)}, force=True)
    ckpt.close()
    storage.write_json(f"{train_dir}/summary.json", {"model": dataclasses.asdict(cfg)})
    train = helpers.Committed("train", "train-key", train_dir, {"summary.json": 1}, {})
    inputs = {"train": train, "tokenizer": helpers.committed("tokenizer", tmp_path / "local" / "tokenizer"),
              "shard": helpers.committed("shard", tmp_path / "local" / "shard")}
    export.run(export.Config(), inputs, f"{gcs_bucket}/export", str(tmp_path / "work"))
    for name in ("model.safetensors", "config.json", "tokenizer.json", "tokenizer.model"):
        assert storage.read_bytes(f"{gcs_bucket}/export/{name}") == (local / name).read_bytes(), name
