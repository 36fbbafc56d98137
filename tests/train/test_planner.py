"""The planner: per-device memory from the config alone, a verdict with advice, and the CLI around it."""

import dataclasses
import glob
import os
import subprocess
import sys

import pytest

from pipeline import config
from stages import train
from stages.train import planner
from stages.train.configs import HardwareConfig, MeshConfig, ModelConfig, param_counts
from tests.conftest import REPO

FLAGSHIP = f"{REPO}/gin/600b.gin"
FITS = "verdict: fits on 1,024 x TPU v5p (95.0 GiB each), topology v5p:8x8x16"


def _flagship(*overrides: str):
    return config.load([FLAGSHIP], list(overrides)).stages["train"].config


def test_one_device_holds_every_parameter_gradient_and_both_adam_moments():
    cfg = train.Config(model=ModelConfig(vocab_size=512, d_model=64, n_layers=2, n_heads=4, n_kv_heads=4,
                                         max_seq_len=64), seq_len=64, global_batch=4)
    p = planner.plan(cfg)
    n = sum(param_counts(cfg.model).values())
    assert p.per_device["params"] == p.per_device["grads"] == 4 * n          # float32
    assert p.per_device["optimizer"] == 2 * 4 * n and p.per_device["gathered"] == 0
    assert p.fits and p.chips == 1 and p.mesh == {"data": 1, "fsdp": 1, "tensor": 1}


def test_sharding_divides_the_state_the_way_training_places_it():
    m = ModelConfig(vocab_size=1024, d_model=256, n_layers=4, n_heads=8, n_kv_heads=2, max_seq_len=128)
    base = train.Config(model=m, seq_len=128, global_batch=8, hardware=HardwareConfig(chips=8))
    one = planner.plan(dataclasses.replace(base, mesh=MeshConfig(data=8)))
    fsdp = planner.plan(dataclasses.replace(base, mesh=MeshConfig(data=1, fsdp=8)))
    tensor = planner.plan(dataclasses.replace(base, mesh=MeshConfig(data=4, tensor=2)))
    assert one.per_device["params"] == 4 * sum(param_counts(m).values())     # data parallel: replicated
    # Every parameter has an "embed" axis (256, split 8 ways): fsdp 8 leaves each device exactly an eighth.
    assert fsdp.per_device["params"] * 8 == one.per_device["params"]
    # tensor 2 halves everything with a heads, kv_heads, mlp or vocab axis (2 kv heads split too); the
    # norm scales have none of those axes and stay whole.
    norms = 4 * (2 * 4 * 256 + 256)
    assert tensor.per_device["params"] == (one.per_device["params"] - norms) // 2 + norms
    assert fsdp.per_device["gathered"] > 0 and one.per_device["gathered"] == 0


def test_heavier_remat_keeps_less():
    cfg = _flagship()
    kept = {r: planner.activation_bytes(dataclasses.replace(cfg.model, remat=r), 1, 8192, 8, loss_chunk=8192)
            for r in planner.REMAT_ORDER}
    values = [kept[r] for r in planner.REMAT_ORDER]
    assert values == sorted(values, reverse=True) and kept["none"] > 5 * kept["full"]


def test_the_flagship_fits_its_slice_and_an_undersized_layout_is_told_what_would():
    p = planner.plan(_flagship())
    assert p.fits and p.chips == 1024 and p.device.name == "tpu-v5p"
    assert p.render().splitlines()[-1] == "  " + FITS
    small = planner.plan(_flagship("train.MeshConfig.fsdp=16"))
    assert not small.fits
    assert "does NOT fit" in small.render() and "It would fit with train.MeshConfig.fsdp=32" in small.advice
    unsplit = planner.plan(_flagship("train.MeshConfig.fsdp=16", "train.MeshConfig.tensor=1"))
    assert "does not split over data x fsdp = 1024 devices" in unsplit.problem
    assert "train.MeshConfig.tensor=8" in unsplit.advice


def test_training_refuses_a_config_that_cannot_fit_unless_told_to_try():
    cfg = _flagship("train.MeshConfig.fsdp=16")
    with pytest.raises(ValueError, match="Refusing to train a config that does not fit"):
        train.check_fits(cfg)
    train.check_fits(dataclasses.replace(cfg, hardware=dataclasses.replace(cfg.hardware, allow_unfit=True)))


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "pipeline", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=120)


def test_plan_with_placeholders_works_offline_and_run_stops_with_one_line():
    plan = _cli("plan", "--gin", FLAGSHIP, "--no-compile")     # the compile (~50 s) is shown by hand
    assert plan.returncode == 0, plan.stderr
    assert "note: fill in before running: pipeline.Settings.cache_root = 'gs://YOUR_BUCKET/refinery'" \
        in plan.stdout
    assert plan.stdout.rstrip().endswith(FITS)
    run = _cli("run", "--gin", FLAGSHIP)
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.count("\n") == 1 and "leaves placeholders to fill in" in run.stderr
    assert "train.LaunchConfig.tpu_name = 'YOUR_TPU_SLICE'" in run.stderr


def test_an_unreachable_cache_root_is_one_line():
    out = _cli("status", "--gin", f"{REPO}/gin/tiny.gin", "--gin-param",
               'pipeline.Settings.cache_root = "s4://bucket/x"')
    assert out.returncode == 2 and out.stderr.count("\n") == 1
    assert out.stderr.startswith("error: cannot reach the cache root s4://bucket/x")


@pytest.mark.slow
def test_plan_compiles_the_real_train_step_for_a_tpu_topology_ahead_of_time():
    out = _cli("plan", "--gin", f"{REPO}/gin/tiny.gin", "--overrides",
               'train.HardwareConfig.device="tpu-v5p" train.HardwareConfig.topology="v5p:2x2x1" '
               "train.MeshConfig.fsdp=4")
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.rstrip().splitlines()
    assert lines[-1] == "  verdict: fits on 4 x TPU v5p (95.0 GiB each), topology v5p:2x2x1"
    assert lines[-2].startswith("  XLA, compiled for v5p:2x2x1: ") and "per device" in lines[-2], lines[-2]


def test_no_topology_means_no_compile_and_no_jax():
    code = ("import sys; from pipeline import config; from stages import train; "
            f"print(train.plan(config.load([{REPO + '/gin/tiny.gin'!r}]).stages['train'].config)); "
            "print('JAX', 'jax' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.stdout.rstrip().endswith("JAX False") and "XLA" not in out.stdout, out.stdout + out.stderr


RUN_FILES = sorted(os.path.relpath(p, f"{REPO}/gin") for p in glob.glob(f"{REPO}/gin/*.gin")
                   + glob.glob(f"{REPO}/gin/twins/*.gin"))


@pytest.mark.parametrize("run_file", RUN_FILES)
def test_every_run_file_fits_its_hardware(run_file):
    """A run file that the planner rejects would fail in training before its first step: catch it here."""
    p = planner.plan(config.load([f"{REPO}/gin/{run_file}"]).stages["train"].config)
    assert p.fits, p.render()


def test_every_run_file_has_a_twin():
    runs = {f for f in RUN_FILES if "/" not in f and f != "tiny.gin"}
    assert runs == {"124m.gin", "1b.gin", "9b.gin", "600b.gin"}
    assert {f"twins/{f}" for f in runs} <= set(RUN_FILES)
