"""The training worker's spec: JSON that round-trips every config field and refuses anything else.

    .venv/bin/python -m pytest -q tests/train/test_spec.py
"""

from __future__ import annotations

import dataclasses
import json
import os

import pytest

from pipeline import cache
from stages import train
from stages.train import spec
from stages.train.launch import LaunchConfig
from stages.train.mesh import MeshConfig
from stages.train.model_config import ModelConfig
from stages.train.optimizer_config import OptimizerConfig
from stages.train.planning.hardware import HardwareConfig
from stages.train.tracking import Tracking
from tests.conftest import REPO

# Every field of every nested config differs from its default (test_every_field_is_off_its_default).
FULL = train.Config(
    model=ModelConfig(vocab_size=1000, d_model=96, n_layers=3, n_heads=6, n_kv_heads=2, head_dim=32,
                      mlp_dim=320, max_seq_len=512, rope_theta=500000.0, rope_scaling="yarn", rope_factor=4.0,
                      rope_original_max_len=128, tie_embeddings=True, norm_eps=1e-6, dtype="float32",
                      param_dtype="bfloat16", attention_impl="blockwise", attention_block_q=128,
                      attention_block_k=256, remat="offload_minimal", scan_layers=False, init_std=0.01,
                      n_experts=4, n_experts_per_token=3, n_shared_experts=1, moe_mlp_dim=64,
                      n_dense_layers=1,
                      router_score="sigmoid", router_norm_topk=True, router_groups=2, router_topk_groups=2,
                      moe_capacity_factor=1.5, moe_impl="tiled", moe_aux_loss=0.01, moe_router_z_loss=1e-3,
                      moe_bias_update_rate=1e-3, sequence_parallel=True, router_scale=2.5,
                      moe_aux_scope="sequence", moe_tile_rows=64),
    optimizer=OptimizerConfig(name="lion", learning_rate=1e-4, schedule="wsd", warmup_steps=10,
                              total_steps=300, min_lr_ratio=0.05, wsd_decay_fraction=0.3, b1=0.8, b2=0.99,
                              eps=1e-6, weight_decay=0.2, clip_norm=0.5, grad_accum_steps=2),
    mesh=MeshConfig(data=2, fsdp=2, tensor=2, expert=2, dcn_data=2, dcn_fsdp=2, dcn_tensor=2, dcn_expert=2,
                    device_order="fsdp:2x1x1,tensor:1x2x1,expert:1x1x2"),
    steps=300, global_batch=32, seq_len=384, seed=7, z_loss=1e-4, loss_chunk=2048, eval_every=25,
    eval_batches=2, nan_policy="skip", init_from="gs://models/llama", log_every=5, checkpoint_every=50,
    keep_checkpoints=3,
    mixture=train.Mixture(phases=((0, {"web": 0.75, "code": 0.25}), (200, {"web": 0.5, "code": 0.5})),
                          max_epochs=3.0),
    launcher=LaunchConfig(kind="tpu_vm", num_processes=4, tpu_name="pod", zone="us-east5-a", project="proj",
                          remote_dir="/opt/refinery", timeout_s=3600),
    hardware=HardwareConfig(device="tpu-v5p", topology="v5p:2x2x2", chips=16, num_slices=16, mfu=0.5,
                            allow_unfit=True, storage_bytes_per_s=2.5e9, interruptions_per_chip_hour=1e-5,
                            restart_s=300.0),
    stop_after=120,
    tracking=Tracking(tracker="wandb", project="p", entity="team", mode="offline", tags=("a", "b"), group="g",
                      name="n", dir="/tmp/wandb"))

# Multi-head latent attention's fields, which exclude head_dim and grouped kv heads: a second model.
MLA = dataclasses.replace(FULL.model, attention_kind="mla", n_kv_heads=6, head_dim=0, q_lora_rank=48,
                          kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16)

MANIFEST = {"attempt": "attempt-20250101T000000-ab12", "files": {"manifest.json": 97, "train-00000.bin": 2048,
                                                                  "val-00000.bin": 512},
            "config": {"@type": "Config", "shard_tokens": 1_000_000}, "wall_s": 12.5, "upstream": {}}
SHARD = cache.Committed("shard", "3f2a", "/cache/shard/3f2a/attempt-20250101T000000-ab12",
                        MANIFEST["files"], MANIFEST)


def _written(tmp_path, config=FULL) -> tuple[str, dict]:
    path = str(tmp_path / "spec.json")
    spec.write(spec.WorkerSpec(config, SHARD, "/cache/train/k/attempt-1", "/cache/train/k/work"), path)
    with open(path) as f:
        return path, json.load(f)


def test_every_field_is_off_its_default():
    """So that the round trip below would notice a field the spec dropped or left at its default."""
    for cfg in (FULL, FULL.model, FULL.optimizer, FULL.mesh, FULL.launcher, FULL.hardware, FULL.tracking):
        default = type(cfg)()
        same = [f.name for f in dataclasses.fields(cfg) if getattr(cfg, f.name) == getattr(default, f.name)]
        if cfg is FULL.model:       # MLA's fields are set in MLA, whose own defaults are FULL.model's
            same = [name for name in same if getattr(MLA, name) == getattr(default, name)]
        assert not same, f"{type(cfg).__name__} fields at their defaults: {same}"


def test_an_mla_model_survives_the_round_trip(tmp_path):
    mla = dataclasses.replace(FULL, model=MLA)
    path, _ = _written(tmp_path, mla)
    assert spec.read(path).config == mla


def test_a_config_with_every_field_set_survives_the_round_trip(tmp_path):
    path, data = _written(tmp_path)
    assert data["format"] == spec.FORMAT
    s = spec.read(path)
    assert s.config == FULL                      # dataclass ==: the same classes, field by field
    assert type(s.config.launcher) is LaunchConfig and type(s.config.hardware) is HardwareConfig
    assert (s.out_dir, s.work_dir) == ("/cache/train/k/attempt-1", "/cache/train/k/work")
    assert type(s.shard) is spec.Committed
    assert dataclasses.astuple(s.shard) == dataclasses.astuple(SHARD)
    assert s.shard.file("manifest.json") == SHARD.file("manifest.json")
    assert s.shard.paths("train-*.bin") == SHARD.paths("train-*.bin") == [f"{SHARD.path}/train-00000.bin"]
    with pytest.raises(FileNotFoundError, match="has no 'summary.json'"):
        s.shard.file("summary.json")


def test_an_int_in_a_float_field_stays_what_gin_gave(tmp_path):
    cfg = dataclasses.replace(FULL, model=dataclasses.replace(FULL.model, rope_theta=500000), z_loss=0)
    path, _ = _written(tmp_path, cfg)
    assert spec.read(path).config == cfg


def test_the_writer_refuses_a_value_of_the_wrong_type_naming_the_field(tmp_path):
    with pytest.raises(TypeError, match=r"config\.steps = float 300\.0, but the field is int"):
        _written(tmp_path, dataclasses.replace(FULL, steps=300.0))


@dataclasses.dataclass(frozen=True)
class _Tupled:
    """The field shapes a config may grow: tuples (which JSON writes as lists), optional values."""

    sizes: tuple[int, ...] = ()
    pair: tuple[str, float] = ("a", 1.0)
    inner: ModelConfig | None = None
    names: tuple[str, ...] | None = None


def test_tuple_and_optional_fields_come_back_as_the_dataclass_declares_them():
    def round_trip(value):
        return spec.decode_as(json.loads(json.dumps(spec.encode(value, _Tupled, "t"))), _Tupled, "t", "test")

    value = _Tupled(sizes=(1, 2, 3), pair=("b", 2.5), inner=ModelConfig(d_model=128), names=("x", "y"))
    back = round_trip(value)
    assert back == value and type(back.sizes) is tuple and type(back.names) is tuple
    assert round_trip(_Tupled()) == _Tupled()
    data = spec.encode(value, _Tupled, "t")
    with pytest.raises(ValueError, match=r"test: t\.pair = list \['b', 2, 3\], but the field is tuple"):
        spec.decode_as(data | {"pair": ["b", 2, 3]}, _Tupled, "t", "test")
    with pytest.raises(ValueError, match=r"t\.sizes\[1\] = str '2', but the field is int"):
        spec.decode_as(data | {"sizes": [1, "2"]}, _Tupled, "t", "test")
    with pytest.raises(TypeError, match=r"t\.sizes = list \[1, 2\], but the field is tuple\[int, \.\.\.\]"):
        spec.encode(_Tupled(sizes=[1, 2]), _Tupled, "t")     # a list would come back a tuple: not equal


def _set(*keys, value):
    def edit(data):
        *parents, last = keys
        for k in parents:
            data = data[k]
        data[last] = value
    return edit


def _delete(*keys):
    def edit(data):
        *parents, last = keys
        for k in parents:
            data = data[k]
        del data[last]
    return edit


@pytest.mark.parametrize("edit, message", [
    (_set("config", "model", "d_modl", value=256), "config.model.d_modl is not a field of ModelConfig"),
    (_set("eval_dir", value="/x"), "eval_dir is not a field of WorkerSpec"),
    (_set("config", "steps", value="300"), "config.steps = str '300', but the field is int"),
    (_set("config", "seed", value=True), "config.seed = bool True, but the field is int"),
    (_set("config", "global_batch", value=32.0), "config.global_batch = float 32.0, but the field is int"),
    (_set("config", "model", "tie_embeddings", value=1), "config.model.tie_embeddings = int 1, but the field "
                                                         "is bool"),
    (_set("config", "mesh", value=[2, 2, 2]), "config.mesh = list [2, 2, 2], but the field is a JSON object "
                                              "(MeshConfig)"),
    (_set("shard", "files", "val-00000.bin", value="512"), "shard.files['val-00000.bin'] = str '512', but "
                                                           "the field is int"),
    (_set("shard", "files", value=["val-00000.bin"]), "shard.files = list ['val-00000.bin'], but the field "
                                                      "is dict[str, int]"),
    (_set("out_dir", value=None), "out_dir = NoneType None, but the field is str"),
    (_delete("config", "optimizer", "b1"), "config.optimizer.b1 is missing"),
    (_set("config", "model", "n_layers", value=0), "config.model: ModelConfig.n_layers=0 must be >= 1"),
    (_set("format", value="refinery.train.spec/0"), "format='refinery.train.spec/0', but this worker reads"),
    # what a pickle-minded payload looks like in JSON: a field nobody declared, or a value of the wrong shape
    (_set("config", "__reduce__", value=["os.system", ["touch pwned"]]),
     "config.__reduce__ is not a field of Config"),
    (_set("config", "launcher", value={"py/reduce": [{"py/function": "os.system"}, {"py/tuple": ["id"]}]}),
     "config.launcher.py/reduce is not a field of LaunchConfig"),
    (_set("config", "nan_policy", value={"__class__": "os.system", "args": ["id"]}),
     "config.nan_policy = dict {'__class__': 'os.system', 'args': ['id']}, but the field is str"),
])
def test_a_spec_off_the_schema_is_refused_naming_the_file_and_the_field(tmp_path, edit, message):
    path, data = _written(tmp_path)
    edit(data)
    with open(path, "w") as f:
        json.dump(data, f)
    with pytest.raises(ValueError) as e:
        spec.read(path)
    assert str(e.value).startswith(f"{path}: ")
    assert message in str(e.value)


@pytest.mark.parametrize("text, message", [
    ('{"format": "refinery.train.spec/1", "format": "x"}', "the key 'format' appears twice"),
    ('{"z_loss": NaN}', "NaN is not a JSON number"),
    ('[1, 2]', "a worker spec is a JSON object, not list"),
])
def test_text_that_is_not_one_plain_json_object_is_refused(tmp_path, text, message):
    path = tmp_path / "spec.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        spec.read(str(path))


def test_a_pickle_payload_is_refused_and_never_runs(tmp_path):
    """The classic protocol-0 payload that calls os.system when unpickled: here it is only bytes."""
    marker = tmp_path / "pwned"
    path = tmp_path / "spec.json"
    path.write_bytes(f"cos\nsystem\n(S'touch {marker}'\ntR.".encode())
    with pytest.raises(ValueError, match=f"{path} is not a JSON worker spec"):
        spec.read(str(path))
    assert not marker.exists()


def test_nothing_that_reads_the_spec_can_unpickle():
    """Grep-style: the worker, the launchers and the spec module never mention pickle at all."""
    for name in ("worker.py", "launch.py", "spec.py"):
        with open(os.path.join(REPO, "stages", "train", name)) as f:
            source = f.read().lower()
        assert "pickle" not in source, f"stages/train/{name} mentions pickle"
