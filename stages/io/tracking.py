"""Experiment tracking in Weights & Biases: one W&B run per trained model, optional, out of every key.

    train.Tracking.tracker = "wandb"          # gin; "none" (the default) tracks nothing
    train.Tracking.project = "refinery"
    train.Tracking.mode = "offline"           # "online" (needs WANDB_API_KEY), "offline", "disabled"
    make pipeline GIN=gin/tiny.gin OVERRIDES='train.Tracking.tracker="wandb" train.Tracking.mode="offline"'
    wandb sync wandb/offline-run-*            # an offline run, later, from a machine with a network

W&B is an extra (`pip install -e '.[wandb]'`); the default install never imports it. What a run holds:
every row of metrics.jsonl as it is logged (loss, learning rate, throughput, evaluations, in-loop
yardsticks, MoE balance), the training config, and, once the pipeline has run, every stage's key and
one-line summary, the gin the keys cover, and the evaluation's figures (`eval/...` in the run's summary).

The run's identity lives beside the checkpoints (`<work_dir>/wandb.json`: its id and the last step sent),
so a training that resumes after a stop continues the same W&B run and sends only the steps after the last
one it sent; a training that starts again from step 0 (a forced rerun of the same key) starts a new W&B run.
The committed training output keeps a copy (`wandb.json`), which is how the pipeline finds the run to add
the stages and the evaluation to. A sweep puts its runs in one group, each named `<variant>-seed<s>`.
Tracking says how a run is watched, never what it computes: `Tracking` is out of the cache key.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import os
import secrets
from collections.abc import Mapping
from typing import Any

from stages.io import storage

log = logging.getLogger(__name__)

TRACKERS = ("none", "wandb")
MODES = ("online", "offline", "disabled")
STATE = "wandb.json"       # beside the checkpoints (work_dir) and in the committed training output


@dataclasses.dataclass(frozen=True)
class Tracking:
    """Where a run is tracked (gin: `train.Tracking.<field>`)."""

    tracker: str = "none"          # "none" or "wandb"
    project: str = "refinery"
    entity: str = ""               # the W&B team or user; "" = the API key's default
    mode: str = "online"           # "online", "offline" (files under `dir`, `wandb sync` later), "disabled"
    tags: tuple[str, ...] = ()
    group: str = ""                # a sweep sets its name here
    name: str = ""                 # the run's display name; "" = the training key's first 12 characters
    dir: str = ""                  # where W&B writes its files; "" = WANDB_DIR or the working directory

    def __post_init__(self):
        if self.tracker not in TRACKERS:
            raise ValueError(f"train.Tracking.tracker={self.tracker!r} is not one of {TRACKERS}")
        if self.mode not in MODES:
            raise ValueError(f"train.Tracking.mode={self.mode!r} is not one of {MODES}")
        if self.tracker == "wandb" and not self.project.strip():
            raise ValueError("train.Tracking.project is empty; name the W&B project to log to")

    @property
    def enabled(self) -> bool:
        return self.tracker == "wandb" and self.mode != "disabled"

    def unused_fields(self) -> frozenset[str]:
        """Fields nothing reads when tracking is off (the placeholder check skips them)."""
        return frozenset() if self.enabled else frozenset(f.name for f in dataclasses.fields(self))


def missing() -> str:
    """"" when W&B is installed, else the one line that says how to install it. Looks, never imports: the
    pre-run check calls it, and importing wandb takes ~0.4 s."""
    if importlib.util.find_spec("wandb") is None:
        return ("train.Tracking.tracker='wandb' needs the wandb package, which the default install leaves "
                "out: pip install -e '.[wandb]' (or set train.Tracking.tracker='none')")
    return ""


class Run:
    """One W&B run for one training: `log` each metrics row once, across resumes.

    run = tracking.Run.start(tracking, work_dir, key=..., config={...}, resuming=start > 0)
    run.log(row)                      # a metrics.jsonl row ({"step": 10, "loss": ...}); sent once
    run.close(out_dir)                # finishes the W&B run and copies its state into the output
    """

    def __init__(self, tracking: Tracking, wandb_run, state_path: str, state: dict):
        self.tracking, self._run, self._state_path, self.state = tracking, wandb_run, state_path, state

    @classmethod
    def start(cls, tracking: Tracking, work_dir: str, *, key: str, config: Mapping[str, Any],
              resuming: bool) -> Run | None:
        """The run to log to (None when tracking is off). `resuming`: the training continues from a
        checkpoint, so it continues the W&B run the state file names; otherwise a new W&B run."""
        if not tracking.enabled:
            return None
        if problem := missing():
            raise RuntimeError(problem)
        state_path = storage.join(work_dir, STATE)
        state = storage.read_json(state_path) if resuming and storage.exists(state_path) else None
        if state is None:
            state = {"id": f"{key[:12]}-{secrets.token_hex(3)}", "step": 0, "key": key,
                     "project": tracking.project, "entity": tracking.entity,
                     "name": tracking.name or key[:12], "group": tracking.group}
        run = _init(tracking, state, config=dict(config))
        storage.write_json(state_path, state)
        log.info("tracking in W&B: project %s, run %s (%s, %s mode)", tracking.project, state["name"],
                 state["id"], tracking.mode)
        return cls(tracking, run, state_path, state)

    def log(self, row: Mapping[str, Any]) -> None:
        """Sends `row` (it needs "step") unless a run before this resume sent that step already."""
        step = int(row["step"])
        if step <= self.state["step"]:
            return
        self._run.log(flat({k: v for k, v in row.items() if k not in ("step", "time")}), step=step)
        self.state["step"] = step
        storage.write_json(self._state_path, self.state)

    def close(self, out_dir: str | None = None) -> None:
        """Finishes the W&B run; with `out_dir`, the committed output keeps where it is (`wandb.json`)."""
        _finish(self._run)
        if out_dir is not None:
            storage.write_json(storage.join(out_dir, STATE), self.state)


def annotate(tracking: Tracking, state: Mapping[str, Any], *, config: Mapping[str, Any],
             summary: Mapping[str, Any]) -> None:
    """Adds `config` (the stages' keys and summaries, the gin) and `summary` (the evaluation) to the W&B run
    a finished training logged to (`state`: its committed wandb.json)."""
    if not tracking.enabled:
        return
    run = _init(tracking, dict(state), config={})
    run.config.update(dict(config), allow_val_change=True)
    run.summary.update(flat(summary))
    _finish(run)


def flat(values: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts as "a/b/c" keys; numbers, strings and booleans kept, anything else (lists) left out."""
    out: dict[str, Any] = {}
    for k, v in values.items():
        name = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(flat(v, f"{name}/"))
        elif isinstance(v, (bool, str)) or (isinstance(v, (int, float)) and not isinstance(v, bool)):
            out[name] = v
        elif hasattr(v, "item"):                     # numpy / jax scalars
            out[name] = v.item()
    return out


def _finish(run) -> None:
    """Ends the run and W&B's service process: an offline run's file is complete only once it has stopped
    (right after `finish()` it can still be a bare header)."""
    import wandb

    run.finish()
    wandb.teardown()


def _init(tracking: Tracking, state: Mapping[str, Any], *, config: dict):
    import wandb

    kwargs = {"project": state.get("project") or tracking.project, "id": state["id"], "name": state["name"],
              "group": state.get("group") or None, "tags": list(tracking.tags) or None, "config": config,
              "mode": tracking.mode, "resume": "allow", "reinit": "create_new"}
    if state.get("entity") or tracking.entity:
        kwargs["entity"] = state.get("entity") or tracking.entity
    if tracking.dir:
        os.makedirs(tracking.dir, exist_ok=True)
        kwargs["dir"] = tracking.dir
    return wandb.init(**kwargs)

