"""Hardware and model settings whose mistake was found late are one `error:` line and exit status 2 before any
stage runs: a device and a TPU topology of different generations (issue 37: an H100 with "v5p:2x2x1" was
accepted and "fit"), and an MoE no transformers class holds when the run includes the export (it trained to
the end and then wrote NOT_EXPORTED.md). `make plan` says both.

    .venv/bin/python -m pytest -q -p no:cacheprovider tests/pipeline/test_bad_hardware.py

The cases run `python -m pipeline` in a subprocess through test_bad_config's harness (exit 2, nothing on
stdout, one `error:` line naming the problem, no stage directory made); none imports JAX or Beam.
"""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from pipeline import __main__ as cli
from pipeline import checks, config
from tests.conftest import REPO
from tests.pipeline.test_bad_config import SHIPPED, TINY, _case, _env, assert_one_error_line_before_work

H100_ON_V5P = ('train.HardwareConfig.device="h100"', 'train.HardwareConfig.topology="v5p:2x2x1"')
V5P_ON_V6E = ('train.HardwareConfig.device="tpu-v5p"', 'train.HardwareConfig.topology="v6e:2x2"')
# tiny.gin as an MoE with the softmax router that does not renormalise its top-k: Mixtral always does, and
# GLM-4-MoE's router is the sigmoid, so neither holds it (the default MoE settings, as it happens).
UNEXPORTABLE_MOE = ("train.ModelConfig.n_experts=4", "train.ModelConfig.moe_mlp_dim=64")
NOT_EXPORTABLE = ("export: the trained model cannot be exported to transformers: "
                  "train.ModelConfig.router_norm_topk=False: transformers' MixtralForCausalLM (softmax "
                  "routing) renormalises the top-k weights always; export needs router_norm_topk=True, or "
                  "the sigmoid router (Glm4MoeForCausalLM); or train and evaluate it without the export: "
                  "--stage evaluate (make stage STAGE=evaluate)")

CASES = [
    _case("gpu_device_on_a_tpu_topology",
          ["train.HardwareConfig", "device='h100' and topology='v5p:2x2x1' do not match",
           "the topology is a v5p slice, whose chips are device='tpu-v5p'; set device='tpu-v5p' for this "
           "topology, or topology=\"\" for device='h100'"], *H100_ON_V5P),
    _case("gpu_device_on_a_tpu_topology_in_plan", "device='h100' and topology='v5p:2x2x1' do not match",
          *H100_ON_V5P, command="plan", args=("--no-compile",)),
    _case("cpu_device_on_a_tpu_topology", "device='cpu' and topology='v5e:2x2' do not match",
          'train.HardwareConfig.topology="v5e:2x2"'),
    _case("tpu_device_on_another_generations_topology",
          ["device='tpu-v5p' and topology='v6e:2x2' are different TPU generations",
           "a v6e slice's chips are device='tpu-v6e'; set device='tpu-v6e' for this topology, or for "
           "device='tpu-v5p' a v5p topology (v5p:<grid>, grids 2x2x1, 2x2x2, 2x2x4, 2x4x4, or AxBxC with "
           "every side a multiple of 4"], *V5P_ON_V6E),
    _case("tpu_device_on_another_generations_topology_in_plan",
          "device='tpu-v5p' and topology='v6e:2x2' are different TPU generations", *V5P_ON_V6E,
          command="plan", args=("--no-compile",)),
    _case("tpu_device_on_another_generations_topology_in_a_sweep",
          "device='tpu-v6e' and topology='v4:2x2x1' are different TPU generations",
          'train.HardwareConfig.device="tpu-v6e"', 'train.HardwareConfig.topology="v4:2x2x1"',
          command="sweep", gin_path="gin/sweeps/lr.gin"),
    # The goodput's assumptions (stages/train/planning/goodput.py): a plan's days divide by them.
    _case("checkpoint_storage_rate_of_zero_in_plan",
          "HardwareConfig: storage_bytes_per_s=0.0 must be a finite number > 0 (bytes a host writes to the "
          "checkpoint directory a second, e.g. 1e9)", "train.HardwareConfig.storage_bytes_per_s=0",
          command="plan", args=("--no-compile",)),
    _case("negative_restart_time", "HardwareConfig: restart_s=-600.0 must be a finite number >= 0",
          "train.HardwareConfig.restart_s=-600"),
    _case("moe_no_transformers_class_holds", NOT_EXPORTABLE, *UNEXPORTABLE_MOE),
    _case("moe_no_transformers_class_holds_sigmoid_without_shared_experts",
          ["export: the trained model cannot be exported to transformers: "
           "train.ModelConfig.n_shared_experts=0", "export needs n_shared_experts >= 1"],
          *UNEXPORTABLE_MOE, 'train.ModelConfig.router_score="sigmoid"'),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_a_bad_hardware_or_model_choice_is_one_error_line_before_anything_runs(case, tmp_path):
    assert_one_error_line_before_work(case, tmp_path)


def _plan_output(tmp_path, *params: str) -> subprocess.CompletedProcess:
    args = ["plan", "--no-compile", "--gin", TINY, "--gin-param",
            f'pipeline.Settings.cache_root="{tmp_path / "cache"}"']
    for p in params:
        args += ["--gin-param", p]
    return subprocess.run([sys.executable, "-m", "pipeline", *args], cwd=REPO, env=_env(),
                          capture_output=True, text=True, timeout=60)


def test_plan_says_the_export_would_be_refused_and_still_plans_the_training(tmp_path):
    out = _plan_output(tmp_path, *UNEXPORTABLE_MOE)
    assert out.returncode == 0, out.stderr[-3000:]
    said = [line for line in out.stdout.splitlines() if line.startswith("export: a run would stop here: ")]
    assert said == ["export: a run would stop here: " + NOT_EXPORTABLE.removeprefix("export: ")], out.stdout
    assert "verdict:" in out.stdout                  # the train stage's plan is printed all the same
    assert not (tmp_path / "cache").exists()


def test_plan_of_an_exportable_model_says_nothing_of_the_export(tmp_path):
    out = _plan_output(tmp_path, *UNEXPORTABLE_MOE, "train.ModelConfig.router_norm_topk=True")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "a run would stop here" not in out.stdout, out.stdout


def _stages_to_run(plan, stage: str | None) -> list[str]:
    return cli._to_run(plan, argparse.Namespace(stage=stage, force=False, command="run"))


def test_a_run_that_stops_before_the_export_may_train_a_model_no_class_holds(tmp_path):
    plan = config.load([TINY], [f'pipeline.Settings.cache_root="{tmp_path / "cache"}"', *UNEXPORTABLE_MOE])
    everything = _stages_to_run(plan, None)
    assert "export" in everything
    assert checks.cannot_run(plan, everything) == NOT_EXPORTABLE
    for stage in ("train", "evaluate"):
        todo = _stages_to_run(plan, stage)
        assert "train" in todo and "export" not in todo
        assert checks.cannot_run(plan, todo) == "", stage
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize("gin", SHIPPED)
def test_every_shipped_run_file_can_be_exported(gin, tmp_path):
    plan = config.load([gin], [f'pipeline.Settings.cache_root="{tmp_path / "cache"}"'])
    assert checks.upstream_problem(plan, "export") == ""
