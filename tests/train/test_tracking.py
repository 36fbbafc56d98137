"""Experiment tracking in W&B (stages/train/tracking.py, pipeline/tracked.py), offline, read back from the run
files once the process that wrote them has exited (tests/wandb_files.py)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys

import pytest

from pipeline import cache, sweep, tracked
from stages.io import storage
from stages.train import tracking
from stages.train.stop import STOPPED_EXIT_CODE
from tests import wandb_files
from tests.conftest import REPO
from tests.tiny_run import TINY

TRACKED = ('train.Tracking.tracker = "wandb"', 'train.Tracking.mode = "offline"',
           'train.Tracking.project = "refinery-test"', 'train.Tracking.group = "g"',
           'train.Tracking.tags = ("ci", "tiny")')


def _env(wandb_dir) -> dict[str, str]:
    return dict(os.environ, WANDB_SILENT="true", WANDB_CACHE_DIR=str(wandb_dir / "cache"),
                JAX_PLATFORMS="cpu")


def _argv(root, wandb_dir, stage, *extra) -> list[str]:
    return [sys.executable, "-m", "pipeline", "run", "--stage", stage,
            *TINY.argv(root, *TRACKED, f'train.Tracking.dir = "{wandb_dir}"', *extra)]


def _pipeline(root, wandb_dir, *extra) -> subprocess.CompletedProcess:
    return subprocess.run(_argv(root, wandb_dir, "evaluate", *extra), cwd=REPO, env=_env(wandb_dir),
                          capture_output=True, text=True, timeout=900)


def _metrics(committed) -> list[dict]:
    return [json.loads(line) for line in storage.read_text(committed.file("metrics.jsonl")).splitlines()]


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
    # The stopped segment ended unfinished (W&B shows it failed until the resume finishes the run).
    assert [run["exit_code"] for run in runs] == [STOPPED_EXIT_CODE, 0, 0]
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
    assert set(added["stages"]) == {"download", "classifier", "score", "clean", "tokenizer", "shard",
                                    "yardsticks", "train", "evaluate", "export"}
    # --stage evaluate built no export: the config names the key it will have, and says it is not built.
    assert added["stages"]["export"] == {"key": plan.stages["export"].key, "summary": tracked.NOT_BUILT}
    assert added["stages"]["evaluate"]["summary"].startswith("val loss ")
    assert "train.Config.steps = 12" in added["gin"]["train"]
    figures = storage.read_json(evaluation.file("eval.json"))
    assert runs[2]["summary"]["eval/loss"] == pytest.approx(figures["loss"])
    assert runs[2]["summary"]["eval/bits_per_byte"] == pytest.approx(figures["bits_per_byte"])


@pytest.mark.slow
def test_a_training_killed_hard_between_logged_steps_resumes_with_every_step_in_wandb_once(tiny_run,
                                                                                           tmp_path):
    """SIGKILL ends the tracked training (a row logged every step, a checkpoint every 3) right after it logged
    a step from 8 on, once a checkpoint is on disk, and W&B's service with it, as a lost machine would: the
    W&B file holds what the service had written, not every row `wandb.log` took. The resume reads what W&B's
    files hold, sends the rows kept beside the checkpoint after it again, and the W&B files hold every
    metrics.jsonl step exactly once."""
    root, wandb_dir = str(tmp_path / "cache"), tmp_path / "wandb"
    tiny_run.copy_to(root)
    every = ("train.Config.log_every = 1", "train.Config.checkpoint_every = 3")
    checkpoints = os.path.join(cache.stage_dir(root, "train", TINY.plan(root, *every).stages["train"].key),
                               cache.WORK, "checkpoints")

    def late_with_a_checkpoint(line: str) -> bool:      # Orbax saves in the background: a step dir is done
        logged = re.search(r"step (\d+)/12", line)
        return bool(logged) and int(logged.group(1)) >= 8 and os.path.isdir(checkpoints) and any(
            name.isdigit() for name in os.listdir(checkpoints))

    code, out, services = _killed_at(_argv(root, wandb_dir, "train", *every), _env(wandb_dir),
                                     late_with_a_checkpoint)
    assert code == -signal.SIGKILL and services, out[-3000:]
    done = subprocess.run(_argv(root, wandb_dir, "train", *every), cwd=REPO, env=_env(wandb_dir),
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "resumed from step" in done.stderr + done.stdout

    plan = TINY.plan(root, *every)
    train = cache.load(plan.cache_root, "train", plan.stages["train"].key)
    runs = wandb_files.read_all(str(wandb_dir), storage.read_json(train.file(tracking.STATE))["id"])
    # One W&B run: the killed segment (never finished), the resumed one, the stages added after it.
    assert [run["exit_code"] for run in runs] == [None, 0, 0]
    logged = sorted((row["_step"], row["loss"]) for run in runs for row in run["history"])
    rows = _metrics(train)
    assert [step for step, _ in logged] == [r["step"] for r in rows] == list(range(1, 13))
    assert [loss for _, loss in logged] == pytest.approx([r["loss"] for r in rows], rel=1e-6)


def _killed_at(argv: list[str], env: dict, when) -> tuple[int, str, list[int]]:
    """Runs `argv` in a session of its own and, at its first output line for which `when(line)` holds,
    SIGKILLs W&B's service (wandb-core starts a session of its own and watches the training's pid, so killing
    the run's group alone would let it finish its file) and the run's whole group. Returns the run's exit
    status, its output and the service processes killed."""
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    out, services = [], []
    try:
        for text in proc.stdout:
            out.append(text)
            if when(text):
                services = _services_of(proc.pid)
                for pid in services:
                    os.kill(pid, signal.SIGKILL)
                os.killpg(proc.pid, signal.SIGKILL)
                break
    finally:
        if proc.poll() is None:        # the leader is not reaped yet: its group id cannot have been reused
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return proc.returncode, "".join(out), services


def _services_of(group: int) -> list[int]:
    """The wandb-core processes that watch a process of the process group `group` (`--pid <pid>`)."""
    def fields(pid: str) -> list[str]:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    pids = [p for p in os.listdir("/proc") if p.isdigit()]
    members, found = set(), []
    for pid in pids:
        try:
            if int(fields(pid)[2]) == group:          # after the name: state, ppid, pgrp
                members.add(pid)
        except (OSError, IndexError):                 # gone meanwhile
            continue
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        if os.path.basename(args[0]) == "wandb-core" and "--pid" in args and \
                args[args.index("--pid") + 1:][:1] and args[args.index("--pid") + 1] in members:
            found.append(int(pid))
    return found


def test_a_resume_after_a_hard_kill_sends_what_wandbs_files_lack(tmp_path, monkeypatch):
    """A process logs steps 3, 6 and 9, then it and W&B's service are SIGKILLed: `wandb.log` returned for each
    (the state file says 9 was sent), but the service had not written them all. The resume, from the step-6
    checkpoint, sends again the kept rows W&B's file lacks, then 9 and 12: each step in W&B's files once."""
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "cache"))
    work, wandb_dir = str(tmp_path / "train" / "k" / "work"), str(tmp_path / "wandb")
    killed = subprocess.run([sys.executable, "-c", KILLED_AFTER_LOGGING, work, wandb_dir], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert "killed wandb-core" in killed.stdout, killed.stdout
    assert storage.read_json(f"{work}/{tracking.STATE}")["step"] == 9      # handed to W&B, as before the fix

    settings = tracking.Tracking(tracker="wandb", mode="offline", dir=wandb_dir)
    again = tracking.Run.start(settings, work, key="k" * 64, config={}, resuming=True)
    again.resend([{"step": 3, "loss": 7.0}, {"step": 6, "loss": 4.0}])    # the rows kept with the checkpoint
    for step in (9, 12):
        again.log({"step": step, "loss": 10.0 - step})
    again.close()
    runs = wandb_files.read_all(wandb_dir, again.state["id"])
    assert sorted(r["_step"] for run in runs for r in run["history"]) == [3, 6, 9, 12]
    assert storage.read_json(f"{work}/{tracking.STATE}")["step"] == 12


# Logs three steps, then SIGKILLs W&B's service (its child) and itself: a lost machine, right after logging.
KILLED_AFTER_LOGGING = """
import os, signal, sys
from stages.train import tracking
settings = tracking.Tracking(tracker="wandb", mode="offline", dir=sys.argv[2])
run = tracking.Run.start(settings, sys.argv[1], key="k" * 64, config={}, resuming=False)
for step in (3, 6, 9):
    run.log({"step": step, "loss": 10.0 - step})
for pid in (p for p in os.listdir("/proc") if p.isdigit()):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = f.read().split(b"\\0")
    except OSError:
        continue
    if os.path.basename(args[0]) == b"wandb-core" and str(os.getpid()).encode() in args:
        print("killed wandb-core", pid, flush=True)
        os.kill(int(pid), signal.SIGKILL)
os.kill(os.getpid(), signal.SIGKILL)
"""


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


def test_the_wandb_config_names_every_stage_of_the_training_its_export_included(tmp_path):
    """What pipeline/tracked.py adds to a training's W&B run covers its evaluation and its export (a commit of
    either annotates the run); a stage not built yet is named by its planned key, where it will be."""
    plan = TINY.plan(str(tmp_path / "cache"), *TRACKED)
    assert tracked.after(plan, "train") == ["train", "evaluate", "export"]
    stages = tracked.dag_config(plan, tracked.after(plan, "train"))["stages"]
    assert set(stages) == set(plan.stages) == {"download", "classifier", "score", "clean", "tokenizer",
                                               "shard", "yardsticks", "train", "evaluate", "export"}
    assert stages["export"] == {"key": plan.stages["export"].key, "summary": tracked.NOT_BUILT}
