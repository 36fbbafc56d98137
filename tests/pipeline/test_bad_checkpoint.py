"""A checkpoint or pretrained file from outside (train.Config.init_from, tokenizer.Config.pretrained) that
names files outside its directory, is damaged or does not hold the model its config.json describes is one
`error:` line and exit status 2 before any stage runs, nothing written: the table of
tests/pipeline/test_bad_config.py, for those inputs, and the same checks on the GCS emulator.

    .venv/bin/python -m pytest -q -p no:cacheprovider tests/pipeline/test_bad_checkpoint.py

Every checkpoint here is a one-layer Llama written with numpy (stages/io/safetensors.py), bound to the
sizes gin/tiny.gin sets (a differing binding is an error of its own), then damaged in one way. No case
trains or imports JAX; the key tests read listings only.
"""

from __future__ import annotations

import json
import os
import struct

import numpy as np
import pytest

from pipeline import checks, config, dag
from stages import tokenizer, train
from stages.io import safetensors, storage
from stages.train import hf, init_from
from stages.train.model_config import ModelConfig
from tests.conftest import REPO
from tests.pipeline.test_bad_config import _case, assert_one_error_line_before_work

TINY = os.path.join(REPO, "gin", "tiny.gin")
SETTINGS = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 4096,
            "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
            "num_key_value_heads": 1, "max_position_embeddings": 256, "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0, "tie_word_embeddings": False}
# What gin/tiny.gin binds differently from SETTINGS, set to SETTINGS' values.
MODEL = ("train.ModelConfig.d_model=16", "train.ModelConfig.n_layers=1", "train.ModelConfig.n_heads=2",
         "train.ModelConfig.n_kv_heads=1", "train.ModelConfig.mlp_dim=32")
MCFG = ModelConfig(vocab_size=4096, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=8, mlp_dim=32,
                   max_seq_len=256, norm_eps=1e-5)
HF = "train.Config.init_from=\"{dir}/hf\""


def _specs(mcfg=MCFG, dtype="float16") -> list[safetensors.Spec]:
    return [safetensors.Spec(t.name, t.shape, dtype) for t in hf.tensors(mcfg)]


def _weights(specs=None, *, header: bytes | None = None, cut: int | None = None) -> bytes:
    """A safetensors file of zeros for `specs` (the model's), its header replaced by `header` or its bytes
    cut to `cut` when given."""
    specs = _specs() if specs is None else specs
    head = safetensors.header(specs)
    data = b"\0" * sum(s.nbytes for s in specs)
    raw = (header if header is not None else head) + data
    return raw[:cut] if cut is not None else raw


def _edited(edit) -> bytes:
    """The model's header with `edit(entries)` applied to its JSON (same length prefix recomputed)."""
    head = safetensors.header(_specs())
    entries = json.loads(head[8:])
    edit(entries)
    text = json.dumps(entries).encode()
    return struct.pack("<Q", len(text)) + text


def _text(obj) -> str:
    """JSON for a case's files, braces escaped for the case's `{dir}` filling."""
    return json.dumps(obj).replace("{", "{{").replace("}", "}}").replace("<DIR>", "{dir}")


def _checkpoint(*params, config=None, weights=None, index=None, more=(), **kw) -> dict:
    """A case's files and params: hf/config.json (SETTINGS, or `config` as given), hf/model.safetensors (or
    `weights`, None to leave it out), an index when given, and `more` files; init_from bound to hf/."""
    files = [("hf/config.json", config if isinstance(config, (str, bytes)) else _text(config or SETTINGS))]
    if weights is not False:
        files.append(("hf/model.safetensors", _weights() if weights is None else weights))
    if index is not None:
        files.append(("hf/" + safetensors.INDEX, _text({"metadata": {}, "weight_map": index})))
    return {"files": tuple(files) + tuple(more), "params": (HF, *MODEL, *params), **kw}


def _ck(name, expect, *params, **kw):
    spec = _checkpoint(*params, **kw)
    return _case(name, expect, *spec["params"], files=spec["files"])


def _all_in(file: str) -> dict[str, str]:
    return {t.name: file for t in hf.tensors(MCFG)}


# A sentencepiece ModelProto of 4,096 empty pieces (field 1, length 0): what init_from counts, without
# training one (the counter reads the protobuf wire format only; tokenizer_problem compares the pieces).
PIECES_4096 = b"\x0a\x00" * 4096
OUTSIDE = (("outside/model.safetensors", _weights()),)
OFFSETS = {name: e["data_offsets"] for name, e in json.loads(safetensors.header(_specs())[8:]).items()}
DATA = sum(s.nbytes for s in _specs())
NORM = OFFSETS["model.norm.weight"][0]
NOT_A_NAME = "names the weight file {name!r}, which is not a file name in {{dir}}/hf"

CASES = [
    # ---- files named outside the directory (the index's weight_map values)
    _ck("index_names_a_parent_directory", NOT_A_NAME.format(name="../outside/model.safetensors"),
        weights=False, index=_all_in("../outside/model.safetensors"), more=OUTSIDE),
    _ck("index_names_etc_hostname", NOT_A_NAME.format(name="../../../../../../etc/hostname"),
        weights=False, index=_all_in("../../../../../../etc/hostname")),
    _ck("index_names_an_absolute_path", ["names the weight file '{dir}/outside/model.safetensors'",
                                         "no '..', absolute path, sub-directory or URL"],
        weights=False, index=_all_in("<DIR>/outside/model.safetensors"), more=OUTSIDE),
    _ck("index_names_a_file_url", NOT_A_NAME.format(name="file://{dir}/outside/model.safetensors"),
        weights=False, index=_all_in("file://<DIR>/outside/model.safetensors"), more=OUTSIDE),
    _ck("index_names_a_gs_url", NOT_A_NAME.format(name="gs://bucket/model.safetensors"),
        weights=False, index=_all_in("gs://bucket/model.safetensors")),
    _ck("index_names_an_hf_url", NOT_A_NAME.format(name="hf://owner/name/model.safetensors"),
        weights=False, index=_all_in("hf://owner/name/model.safetensors")),
    _ck("index_names_a_missing_file",
        "names the weight file 'model-00002-of-00002.safetensors', which is not in {dir}/hf",
        index=_all_in(safetensors.SINGLE) | {"lm_head.weight": "model-00002-of-00002.safetensors"}),
    _ck("index_without_a_weight_map", "model.safetensors.index.json has no weight_map", index={}),
    # ---- damaged safetensors files (what tracebacks said at training start, after the data half)
    _ck("truncated_weights",
        "{dir}/hf/model.safetensors: tensor model.embed_tokens.weight has data_offsets [0, 131072] past the "
        "end of the file's 100 bytes of data (truncated?)",
        weights=_weights(cut=len(safetensors.header(_specs())) + 100)),
    _ck("header_length_two_to_the_62",
        "{dir}/hf/model.safetensors: its header length 4,611,686,018,427,387,904 runs past the end of the "
        "file",
        weights=struct.pack("<Q", 2 ** 62) + _weights()[8:]),
    _ck("header_longer_than_the_file",
        "its header length 1,000,000 runs past the end of the file (400 bytes)",
        weights=struct.pack("<Q", 1_000_000) + b" " * 392),
    _ck("file_shorter_than_the_length",
        "{dir}/hf/model.safetensors: 3 bytes, too short for the 8-byte header",
        weights=b"\x01\x02\x03"),
    _ck("header_not_utf8", "{dir}/hf/model.safetensors: its header is not UTF-8",
        weights=struct.pack("<Q", 16) + b"\xff" * 16 + b"\0" * 64),
    _ck("header_not_json", "{dir}/hf/model.safetensors: its header is not JSON",
        weights=struct.pack("<Q", 8) + b"{{{{{{{{"),
    _ck("header_a_json_list", "{dir}/hf/model.safetensors: its header is a JSON list, not an object",
        weights=struct.pack("<Q", 8) + b"[1, 2]  " + b"\0" * 8),
    _ck("offsets_past_the_end",
        f"{{dir}}/hf/model.safetensors: tensor lm_head.weight has data_offsets "
        f"{[OFFSETS['lm_head.weight'][0], DATA + 8]} past the end of the file's {DATA:,} bytes of data",
        weights=_weights(header=_edited(lambda h: h["lm_head.weight"].update(
            data_offsets=[OFFSETS["lm_head.weight"][0], DATA + 8])))),
    _ck("offsets_not_dtype_times_shape",
        f"tensor model.norm.weight spans 64 bytes (data_offsets {[NORM, NORM + 64]}); F16[16] needs 32",
        weights=_weights(header=_edited(
            lambda h: h["model.norm.weight"].update(data_offsets=[NORM, NORM + 64])))),
    _ck("unknown_dtype", "tensor model.norm.weight has dtype 'F8_E4M3', not one of BF16, BOOL, F16",
        weights=_weights(header=_edited(lambda h: h["model.norm.weight"].update(dtype="F8_E4M3")))),
    _ck("dtype_not_a_string", "tensor model.norm.weight has dtype [16], not one of BF16",
        weights=_weights(header=_edited(lambda h: h["model.norm.weight"].update(dtype=[16])))),
    _ck("offsets_overlap", "tensor model.embed_tokens.weight's data overlaps tensor model.norm.weight's",
        weights=_weights(header=_edited(lambda h: h["model.norm.weight"].update(data_offsets=[0, 32])))),
    # ---- headers that are whole but do not hold config.json's model
    _ck("tensor_shape_not_the_config",
        "{dir}/hf/model.safetensors: tensor model.layers.0.mlp.gate_proj.weight is (48, 16), the model of "
        "config.json needs (32, 16)",
        weights=_weights([s if s.name != "model.layers.0.mlp.gate_proj.weight" else
                          safetensors.Spec(s.name, (48, 16), s.dtype) for s in _specs()])),
    _ck("tensor_missing", "tensor model.norm.weight is in none of its safetensors files (model.safetensors)",
        weights=_weights([s for s in _specs() if s.name != "model.norm.weight"])),
    _ck("tensor_of_integers", "tensor model.norm.weight is int32; a weight is one of float32, bfloat16",
        weights=_weights([s if s.name != "model.norm.weight" else safetensors.Spec(s.name, s.shape, "int32")
                          for s in _specs()])),
    _ck("index_maps_a_tensor_its_file_lacks",
        "maps tensor model.extra.weight to model.safetensors, whose header has no such tensor",
        index=_all_in(safetensors.SINGLE) | {"model.extra.weight": safetensors.SINGLE}),
    # ---- config.json
    _ck("config_a_json_list", "{dir}/hf/config.json is a JSON list, not an object of settings",
        config=_text([SETTINGS])),
    _ck("config_without_num_attention_heads", "{dir}/hf/config.json has no num_attention_heads",
        config={k: v for k, v in SETTINGS.items() if k != "num_attention_heads"}),
    _ck("config_with_zero_heads", "{dir}/hf/config.json: num_attention_heads=0 must be a positive integer",
        config=SETTINGS | {"num_attention_heads": 0}),
    _ck("config_not_json", "{dir}/hf/config.json is not JSON", config="vocab_size: 4096\n"),
    _ck("no_weights", "no model.safetensors or model.safetensors.index.json", weights=False),
    # ---- the checkpoint's tokenizer (what training found only after the data half)
    _ck("no_tokenizer_files", "{dir}/hf has no tokenizer.model or tokenizer.json"),
    _ck("tokenizer_vocab_size_not_the_checkpoints",
        ["the run's tokenizer will have 4,000 pieces (tokenizer.Config.vocab_size), the checkpoint's "
         "{dir}/hf/tokenizer.model has 4,096", "Set tokenizer.Config.pretrained = '{dir}/hf'"],
        "tokenizer.Config.vocab_size=4000", more=(("hf/tokenizer.model", PIECES_4096),)),
    # ---- the tokenizer's pretrained model
    _case("pretrained_tokenizer_random_bytes",
          "tokenizer: tokenizer.Config.pretrained='{dir}/garbage.model': {dir}/garbage.model (4,096 bytes) "
          "is not a sentencepiece model", 'tokenizer.Config.pretrained="{dir}/garbage.model"',
          files=(("garbage.model", np.random.default_rng(0).bytes(4096)),)),
    _case("pretrained_tokenizer_empty", "{dir}/empty/tokenizer.model (0 bytes) is not a sentencepiece model",
          'tokenizer.Config.pretrained="{dir}/empty"', files=(("empty/tokenizer.model", b""),)),
]


def test_the_table_names_each_case_once():
    assert len({c.name for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_a_bad_checkpoint_is_one_error_line_before_anything_runs(case, tmp_path):
    assert_one_error_line_before_work(case, tmp_path)


def test_an_unreachable_hub_repository_is_one_line(tmp_path, monkeypatch):
    # Nothing listens on port 1: the hub is unreachable at once, as offline, and no test reaches the network.
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:1")
    # tests/stages/test_harness.py sets it for the whole test process at import (its children inherit it)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    sha = "0123456789abcdef0123456789abcdef01234567"
    source = f"hf://refinery-test/none@{sha}"
    case = _case("unreachable_hub", [f"train: cannot read {source}/config.json", "ConnectError"],
                 f'train.Config.init_from="{source}"')
    assert_one_error_line_before_work(case, tmp_path)
    # Offline on purpose: huggingface_hub asks only its cache, which has nothing; that is said, not "no file"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    case = _case("offline_hub", [f"train: cannot read {source}/config.json: HF_HUB_OFFLINE is set"],
                 f'train.Config.init_from="{source}"')
    (tmp_path / "offline").mkdir()
    assert_one_error_line_before_work(case, tmp_path / "offline")


# --------------------------------------------------------------------------------------------------------
# The same on the GCS emulator: the CLI reaches it (STORAGE_EMULATOR_HOST is in its environment)


@pytest.mark.parametrize("name, weight_file", [
    ("parent", "../outside/model.safetensors"),
    ("absolute", "<LOCAL>"),                         # a local file that exists: read before, never now
    ("other_bucket", "gs://<BUCKET>-other/model.safetensors"),
    ("local_url", "file://<LOCAL>"),
])
def test_an_index_in_a_bucket_naming_a_file_elsewhere_is_refused(gcs_bucket, tmp_path, name, weight_file):
    local = tmp_path / "local" / "model.safetensors"
    local.parent.mkdir()
    local.write_bytes(_weights())
    named = weight_file.replace("<LOCAL>", str(local)).replace("<BUCKET>", gcs_bucket.removeprefix("gs://"))
    source = f"{gcs_bucket}/hf"
    storage.write_json(f"{source}/config.json", SETTINGS)
    storage.write_json(f"{source}/{safetensors.INDEX}", {"metadata": {}, "weight_map": _all_in(named)})
    storage.write_bytes(f"{gcs_bucket}/outside/model.safetensors", _weights())
    expect = f"train: {source}/{safetensors.INDEX} names the weight file {named!r}, which is not a file name"
    case = _case(f"gcs_{name}", f"{expect} in {source}", f'train.Config.init_from="{source}"', *MODEL)
    assert_one_error_line_before_work(case, tmp_path)


def test_a_damaged_header_in_a_bucket_is_found_by_ranged_reads(gcs_bucket, tmp_path):
    source = f"{gcs_bucket}/hf"
    storage.write_json(f"{source}/config.json", SETTINGS)
    storage.write_bytes(f"{source}/model.safetensors", struct.pack("<Q", 2 ** 62) + _weights()[8:])
    case = _case("gcs_header_length",
                 f"train: train.Config.init_from='{source}': {source}/model.safetensors: its header length "
                 "4,611,686,018,427,387,904 runs past the end of the file",
                 f'train.Config.init_from="{source}"', *MODEL)
    assert_one_error_line_before_work(case, tmp_path)
    # and a whole checkpoint there passes, its header read by range
    storage.write_bytes(f"{source}/model.safetensors", _weights())
    assert init_from.problem(source, MCFG) == ""
    assert set(safetensors.read_specs(f"{source}/model.safetensors")) == {t.name for t in hf.tensors(MCFG)}


# --------------------------------------------------------------------------------------------------------
# What passes, what the key covers


def _write(directory, weights: bytes | None = None, **files: bytes) -> str:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(SETTINGS))
    (directory / "model.safetensors").write_bytes(_weights() if weights is None else weights)
    for name, data in files.items():
        (directory / name.replace("__", ".")).write_bytes(data)
    return str(directory)


def _load(source: str, root: str):
    return config.load([TINY], [f'pipeline.Settings.cache_root="{root}"',
                                f'train.Config.init_from="{source}"', *MODEL])


def test_a_whole_checkpoint_passes_every_check_before_a_run(tmp_path):
    """The cases above fail for their one damage: the undamaged checkpoint passes the CLI's checks."""
    source = _write(tmp_path / "hf", tokenizer__model=PIECES_4096)
    plan = _load(source, str(tmp_path / "cache"))
    model = plan.stages["train"].config.model
    assert {f: getattr(model, f) for f in hf.EXPRESSED} == {f: getattr(MCFG, f) for f in hf.EXPRESSED}
    assert checks.unknown_keys(plan) == ""
    assert checks.cannot_run(plan, list(dag.tree().nodes)) == ""
    # sharded as save_pretrained shards, with its index
    sharded = tmp_path / "sharded"
    _write(sharded, tokenizer__model=PIECES_4096)
    os.remove(sharded / "model.safetensors")
    files = safetensors.plan_shards(_specs(), 140_000)
    names = safetensors.shard_names(len(files))
    assert len(names) == 2
    for name, group in zip(names, files):
        (sharded / name).write_bytes(_weights(group))
    (sharded / safetensors.INDEX).write_text(json.dumps(safetensors.index(files)))
    assert init_from.problem(str(sharded), MCFG) == ""
    assert train.check(_load(str(sharded), str(tmp_path / "cache")).stages["train"].config) == ""


def test_the_pieces_of_a_tokenizer_are_counted_as_sentencepiece_counts_them(tmp_path):
    """init_from's protobuf count of a real model equals sentencepiece's own, a tokenizer.json's vocabulary
    is counted too, and what is not a model is named."""
    from tests.export import helpers

    model = helpers.tokenizer_model(320)
    assert init_from.sentencepiece_pieces(model, "m") == 320
    assert init_from.sentencepiece_pieces(PIECES_4096, "m") == 4096
    for damaged in (model[:-3], b"", b"\x0f" * 8):
        with pytest.raises(ValueError, match="^m is not a sentencepiece model"):
            init_from.sentencepiece_pieces(damaged, "m")
    vocab = {"model": {"vocab": {"a": 0, "b": 1}}}
    source = _write(tmp_path / "hf", tokenizer__json=json.dumps(vocab).encode())
    assert init_from.vocab_problem(source, 2, "x") == ""
    assert "will have 3 pieces (x), the checkpoint's" in init_from.vocab_problem(source, 3, "x")


def test_a_model_config_json_cannot_make_names_the_file(tmp_path):
    """ModelConfig's own checks on what config.json gives (gin binds nothing here to conflict with)."""
    source = tmp_path / "hf"
    source.mkdir()
    (source / "config.json").write_text(json.dumps(SETTINGS | {"num_key_value_heads": 3}))
    (source / "model.safetensors").write_bytes(_weights())
    said = rf"n_kv_heads=3 does not divide n_heads=2.* \(from {source}/config.json\)$"
    with pytest.raises(ValueError, match=said):
        init_from.resolve(ModelConfig(), frozenset(), str(source))


def test_a_header_length_over_the_limit_is_refused_without_reading_it(tmp_path):
    """A length the file could hold but no header has (the safetensors library's own limit): a sparse file
    of 200 MB whose 8-byte length says 150 MB is refused before those bytes are asked for."""
    path = tmp_path / "model.safetensors"
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", 150_000_000))
        f.truncate(200_000_000)
    with pytest.raises(ValueError, match=r"header length 150,000,000 is over the 100,000,000 bytes"):
        safetensors.read_specs(str(path))
    with pytest.raises(ValueError, match=r"header length 150,000,000 is over"):
        safetensors.Reader(str(path))


def test_the_reader_that_loads_weights_checks_the_header_too(tmp_path):
    path = tmp_path / "model.safetensors"
    path.write_bytes(_weights(cut=len(safetensors.header(_specs())) + 100))
    with pytest.raises(ValueError, match=r"model.embed_tokens.weight has data_offsets \[0, 131072\] past"):
        safetensors.Reader(str(path))
    path.write_bytes(_weights())
    with safetensors.Reader(str(path)) as f:
        assert f.array("model.norm.weight").shape == (16,)


def test_the_key_covers_exactly_the_files_read(tmp_path):
    source = _write(tmp_path / "hf", tokenizer__model=b"pieces", README__md=b"# a model card")
    (tmp_path / "hf" / "other.safetensors").write_bytes(b"not named by anything")
    (tmp_path / "hf" / "sub").mkdir()
    key = _load(source, str(tmp_path / "cache")).stages["train"].key
    assert set(train.key_inputs(train.Config(init_from=source))["init_from"]) == {
        "config.json", "model.safetensors", "tokenizer.model"}

    def bump(name):
        p = tmp_path / "hf" / name
        os.utime(p, ns=(p.stat().st_atime_ns, p.stat().st_mtime_ns + 10**9))
        return _load(source, str(tmp_path / "cache")).stages["train"].key

    assert bump("README.md") == key and bump("other.safetensors") == key     # not read: not keyed
    for name in ("config.json", "model.safetensors", "tokenizer.model"):
        changed = bump(name)
        assert changed != key, name
        key = changed
    # sharded: the index and each file it names, not a stale model.safetensors beside them
    files = safetensors.plan_shards(_specs(), 140_000)
    for name, group in zip(safetensors.shard_names(len(files)), files):
        (tmp_path / "hf" / name).write_bytes(_weights(group))
    (tmp_path / "hf" / safetensors.INDEX).write_text(json.dumps(safetensors.index(files)))
    assert set(init_from.fingerprint(source)) == {"config.json", safetensors.INDEX, "tokenizer.model",
                                                  *safetensors.shard_names(2)}


def test_a_pretrained_tokenizer_that_sentencepiece_wrote_passes(tmp_path):
    from tests.export import helpers

    (tmp_path / "tokenizer.model").write_bytes(helpers.tokenizer_model())
    assert tokenizer.check(tokenizer.Config(pretrained=str(tmp_path))) == ""
    assert tokenizer.check(tokenizer.Config()) == ""
