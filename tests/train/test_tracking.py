"""Experiment tracking in W&B (stages/io/tracking.py, pipeline/tracked.py), offline, read back from the run
files once the process that wrote them has exited (tests/wandb_files.py)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from pipeline import cache, sweep
from stages.io import storage, tracking
from stages.train.stop import STOPPED_EXIT_CODE
from tests import wandb_files
from tests.conftest import REPO
from tests.tiny_run import TINY

TRACKED = ('train.Tracking.tracker = "wandb"', 'train.Tracking.mode = "offline"',
           'train.Tracking.project = "refinery-test"', 'train.Tracking.group = "g"',
           'train.Tracking.tags = ("ci", "tiny")')


def _pipeline(root, wandb_dir, *extra) -> subprocess.CompletedProcess:
    env = dict(os.environ, WANDB_SILENT="true", WANDB_CACHE_DIR=str(wandb_dir / "cache"), JAX_PLATFORMS="cpu")
    return subprocess.run([sys.executable, "-m", "pipeline", "run", "--stage", "evaluate",
                           *TINY.argv(root, *TRACKED, f'train.Tracking.dir = "{wandb_dir}"', *extra)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=900)


@pytest.mark.slow
def test_a_tracked_run_logs_every_step_once_across_a_resume_with_the_config_and_the_evaluation(tiny_run,
                                                                                               tmp_path):
    """The tiny DAG trains with W&B offline, is stopped at step 7 and resumed by a second `make pipeline`:
    the resume continues the same W&B run, and the run's files hold every metrics.jsonl step exactly once
    with its loss, the training config, every stage's key and summary, the gin, and the evaluation."""
    root, wandb_dir = str(tmp_path / "cache"), tmp_path / "wandb"
    tiny_run.copy_to(root)
    stopped = _pipeline(root, wandb_dir, "train.Config.stop_after = 7")
    assert stopped.returncode == STOPPED_EXIT_CODE, stopped.stdout[-2000:] + stopped.stderr[-3000:]
    done = _pipeline(root, wandb_dir)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]

    plan = TINY.plan(root)
    train = cache.load(plan.cache_root, "train", plan.stages["train"].key)
    evaluation = cache.load(plan.cache_root, "evaluate", plan.stages["evaluate"].key)
    state = storage.read_json(train.file(tracking.STATE))
    assert state["key"] == train.key and state["step"] == 12 and state["group"] == "g"
    runs = wandb_files.read_all(str(wandb_dir), state["id"])
    assert len(runs) == 3          # trained to step 7, resumed to 12, then the stages and the evaluation
    for run in runs:
        assert run["run"]["group"] == "g" and run["run"]["project"] == "refinery-test"
        assert run["run"]["tags"] == ["ci", "tiny"] and run["run"]["name"] == train.key[:12]

    logged = [row for run in runs for row in run["history"]]
    rows = [json.loads(line) for line in storage.read_text(train.file("metrics.jsonl")).splitlines()]
    assert [r["_step"] for r in logged] == [r["step"] for r in rows] == [1, 3, 6, 9, 12]
    before, after = ([r["_step"] for r in run["history"]] for run in runs[:2])
    assert max(before) <= 7 < min(after)          # the stopped run's steps, then the resumed run's
    for got, row in zip(logged, rows):          # every number of every row, as metrics.jsonl holds it
        numbers = {k: v for k, v in row.items() if k not in ("step", "time") and isinstance(v, (int, float))}
        assert numbers and {k: got[k] for k in numbers} == pytest.approx(numbers, rel=1e-6)
    assert "eval_loss" in logged[2] and "tokens_per_s" in logged[-1]

    config = runs[0]["run"]["config"]
    assert config["train"]["steps"] == 12 and config["train"]["model"]["d_model"] > 0
    assert "tracking" not in config["train"] and "launcher" not in config["train"]
    added = runs[2]["config"]
    assert added["stages"]["train"]["key"] == train.key
    assert set(added["stages"]) == {"download", "clean", "tokenizer", "shard", "yardsticks", "train",
                                    "evaluate"}
    assert added["stages"]["evaluate"]["summary"].startswith("val loss ")
    assert "train.Config.steps = 12" in added["gin"]["train"]
    figures = storage.read_json(evaluation.file("eval.json"))
    assert runs[2]["summary"]["eval/loss"] == pytest.approx(figures["loss"])
    assert runs[2]["summary"]["eval/bits_per_byte"] == pytest.approx(figures["bits_per_byte"])


def test_a_resume_sends_only_the_steps_after_the_last_one_sent(tmp_path, monkeypatch):
    """A training killed after logging step 9 resumes from its step-6 checkpoint and logs 9 again: W&B
    gets steps 10 on only (it would keep the first 9 and warn), and the state file follows."""
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "cache"))
    settings = tracking.Tracking(tracker="wandb", mode="offline", dir=str(tmp_path / "wandb"))
    work = str(tmp_path / "train" / "k" / "work")
    first = tracking.Run.start(settings, work, key="k" * 64, config={"train": {"steps": 12}}, resuming=False)
    for step in (3, 6, 9):
        first.log({"step": step, "loss": 10.0 - step})
    first.close()                                   # killed after 9: the checkpoint is step 6's
    again = tracking.Run.start(settings, work, key="k" * 64, config={"train": {"steps": 12}}, resuming=True)
    assert again.state["id"] == first.state["id"] and again.state["step"] == 9
    for step in (9, 12):
        again.log({"step": step, "loss": 10.0 - step})
    again.close()                                   # and W&B's service stopped: the files are complete
    runs = wandb_files.read_all(str(tmp_path / "wandb"), first.state["id"])
    assert [[r["_step"] for r in run["history"]] for run in runs] == [[3, 6, 9], [12]]
    assert storage.read_json(f"{work}/{tracking.STATE}")["step"] == 12
    fresh = tracking.Run.start(settings, work, key="k" * 64, config={}, resuming=False)   # from step 0
    assert fresh.state["id"] != first.state["id"] and fresh.state["step"] == 0
    fresh.close()


def test_a_sweeps_runs_share_a_group_and_are_named_for_their_variant_and_seed(tmp_path):
    """gin/sweeps/min_chars.gin: 2 variants x 2 seeds; tracking names them without touching a key."""
    params = [f'pipeline.Settings.cache_root = "{tmp_path}"']
    runs = sweep.runs([f"{REPO}/gin/sweeps/min_chars.gin"], params)
    tracked = [r.plan.stages["train"].config.tracking for r in runs]
    assert {t.group for t in tracked} == {"min_chars"}
    assert sorted(t.name for t in tracked) == sorted(f"{r.variant}-seed{r.seed}" for r in runs)
    assert len({t.name for t in tracked}) == len(runs) == 4
    for r in runs:        # the key of each named run is the key of the same run without a group or name
        sp = r.plan.stages["train"]
        bare = dataclasses.replace(sp, config=dataclasses.replace(sp.config, tracking=tracking.Tracking()))
        assert bare.config.tracking != sp.config.tracking and bare.key == sp.key


def test_tracking_is_out_of_the_key_and_bad_settings_name_the_choices():
    from pipeline import config

    keys = {config.load([f"{REPO}/gin/tiny.gin"], list(extra)).stages["train"].key
            for extra in ((), TRACKED)}
    assert len(keys) == 1
    with pytest.raises(ValueError, match=r"train.Tracking.mode='offlne' is not one of \('online', "):
        tracking.Tracking(tracker="wandb", mode="offlne")
    with pytest.raises(ValueError, match=r"tracker='mlflow' is not one of \('none', 'wandb'\)"):
        tracking.Tracking(tracker="mlflow")
