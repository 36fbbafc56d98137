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

The run's identity lives beside the checkpoints (`<work_dir>/wandb.json`: its id, the last step handed to W&B
and the run files W&B wrote), so a training that resumes after a stop continues the same W&B run; a training
that starts again from step 0 (a forced rerun of the same key) starts a new W&B run.
The committed training output keeps a copy (`wandb.json`), which is how the pipeline finds the run to add
the stages and the evaluation to. A sweep puts its runs in one group, each named `<variant>-seed<s>`.
Tracking says how a run is watched, never what it computes: `Tracking` is out of the cache key.

What a resume sends is decided by what W&B holds, not by the last step handed to it: `wandb.log` returns
before W&B's service has written the row (offline, a kill after 20 rows found none of them written), so a
hard kill (SIGKILL, a lost machine) can lose rows already handed over. Offline, the resume reads the earlier
segments' run files (wandb_files.py); online, it asks the server (the resumed run's starting step; the
server also drops a step below the run's current one). It sends again every metrics row after the last
step held, from the rows kept beside the checkpoints (`Run.resend`), and the loop's rows after that: each
step once, none lost.

A segment that ends early is not a finished run: `close(exit_code=...)` records the stop's exit code (75,
STOPPED_EXIT_CODE, for SIGTERM, Ctrl-C and `stop_after`) or a failure's, and W&B shows the run as failed
until the resume finishes it with 0. Mistakes W&B would find at the start of training (no API key online, its
server out of reach, a directory it cannot write) are found before any stage runs (`problem`, from train's
`check`).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import os
import secrets
import socket
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping
from typing import Any

from stages.io import storage
from stages.train import wandb_files

log = logging.getLogger(__name__)

TRACKERS = ("none", "wandb")
MODES = ("online", "offline", "disabled")
STATE = "wandb.json"       # beside the checkpoints (work_dir) and in the committed training output
# How long W&B's server (or the proxy to it) may take to accept a connection before a run is refused: an
# unreachable server otherwise costs wandb.init 40 s of retries, after the data half has run.
CONNECT_S = 3.0


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


def problem(tracking: Tracking) -> str:
    """What stops `tracking` before any stage runs, in one line, or "" (train's `check`, which `python -m
    pipeline run` calls before anything starts): the wandb package missing, a directory W&B cannot write its
    files in, and, online, no API key W&B would find or its server not accepting a connection. The online
    checks import wandb (about a second): they run only when a tracked training is about to run."""
    if not tracking.enabled:
        return ""
    return missing() or unwritable(tracking) or (online_problem() if tracking.mode == "online" else "")


def unwritable(tracking: Tracking) -> str:
    """Why W&B cannot make its files where `tracking` puts them (train.Tracking.dir, else WANDB_DIR, else the
    working directory, as wandb.init does), in one line, or "". A probe file is made and removed: nothing is
    left behind, not even the directory."""
    where, named = ((tracking.dir, "train.Tracking.dir") if tracking.dir else
                    (os.environ["WANDB_DIR"], "WANDB_DIR (train.Tracking.dir is empty)")
                    if os.environ.get("WANDB_DIR") else
                    (os.getcwd(), "the working directory (train.Tracking.dir is empty and WANDB_DIR unset)"))
    if not storage.is_local(where):
        return f"{named}={where!r} is not a local directory: W&B writes its run files on a local disk"
    if why := storage.unwritable(where):
        return (f"W&B cannot write its files in {named}={where!r} ({why}); set train.Tracking.dir to a "
                "directory you can write")
    return ""


def online_problem() -> str:
    """Why an online W&B run cannot start here, in one line, or "": no API key where wandb.init looks for one
    (WANDB_API_KEY, WANDB_IDENTITY_TOKEN_FILE, the ~/.netrc `wandb login` writes, W&B's settings files), a key
    in a form W&B refuses, or no connection to W&B's server (WANDB_BASE_URL or the settings' base_url, through
    the proxy the settings or HTTPS_PROXY name) within CONNECT_S."""
    from wandb.sdk import wandb_setup
    from wandb.sdk.lib import wbauth

    settings = wandb_setup.singleton().settings       # what wandb.init reads; starts no service
    url, fix = settings.base_url, "or set train.Tracking.mode='offline' and `wandb sync` the run later"
    try:
        found = wbauth.authenticate_session(host=url, source="refinery's check", prompt=False,
                                            update_session=False)
    except Exception as e:  # noqa: BLE001 - W&B's refusal of a key or a URL, reported as it words it
        return f"train.Tracking.mode='online': W&B refuses its credentials for {url}: {e} ({fix})"
    if found is None:
        return (f"train.Tracking.mode='online' needs a W&B API key for {url} and none is set: set "
                f"WANDB_API_KEY or run `wandb login` ({fix})")
    proxy = settings.https_proxy if url.startswith("https:") else settings.http_proxy
    return unreachable(url, proxy or _system_proxy(url), fix)


def unreachable(url: str, proxy: str | None, fix: str) -> str:
    """Why nothing accepts a connection at `url`'s host (or at `proxy`, which reaches it) within CONNECT_S, in
    one line, or "" when something does."""
    target = urllib.parse.urlsplit(proxy or url)
    host, port = target.hostname or "", target.port or (443 if target.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=CONNECT_S).close()
    except OSError as e:
        why = e.strerror or str(e) or type(e).__name__
        via = f" through the proxy {proxy}" if proxy else ""
        return (f"train.Tracking.mode='online': W&B's server {url} cannot be reached{via} ({host}:{port}: "
                f"{why}); check the network or WANDB_BASE_URL ({fix})")
    return ""


def _system_proxy(url: str) -> str | None:
    """The proxy HTTPS_PROXY / HTTP_PROXY name for `url` (None when NO_PROXY exempts its host), as W&B's
    service reads them."""
    parts = urllib.parse.urlsplit(url)
    if urllib.request.proxy_bypass(parts.hostname or ""):
        return None
    return urllib.request.getproxies().get(parts.scheme)


class Run:
    """One W&B run for one training: `log` each metrics row once, across resumes.

    run = tracking.Run.start(tracking, work_dir, key=..., config={...}, resuming=start > 0)
    run.resend(rows_before_start)     # a resume: the kept rows W&B does not hold (a hard kill lost them)
    run.log(row)                      # a metrics.jsonl row ({"step": 10, "loss": ...}); sent once
    run.close(out_dir)                # finishes the W&B run and copies its state into the output
    run.close(exit_code=75)           # or: a segment that stopped (or failed) before the last step
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
        if resuming:
            state["step"] = held(tracking, run, state)
        # Where this segment's rows go: a later resume reads them back (offline) to know what W&B holds.
        state["files"] = [*state.get("files", []), os.path.abspath(run.settings.sync_file)]
        storage.write_json(state_path, state)
        log.info("tracking in W&B: project %s, run %s (%s, %s mode)", tracking.project, state["name"],
                 state["id"], tracking.mode)
        return cls(tracking, run, state_path, state)

    def resend(self, rows: Iterable[Mapping[str, Any]]) -> None:
        """Sends again the `rows` (metrics rows kept beside the checkpoint this training resumed from) after
        the last step W&B holds: a hard kill can lose rows `log` had already handed to W&B."""
        for row in rows:
            self.log(row)

    def log(self, row: Mapping[str, Any]) -> None:
        """Sends `row` (it needs "step") unless W&B holds that step already (sent before this resume)."""
        step = int(row["step"])
        if step <= self.state["step"]:
            return
        self._run.log(flat({k: v for k, v in row.items() if k not in ("step", "time")}), step=step)
        self.state["step"] = step
        storage.write_json(self._state_path, self.state)

    def close(self, out_dir: str | None = None, exit_code: int = 0) -> None:
        """Finishes the W&B run with `exit_code` (not 0: the segment stopped or failed before the last step,
        and W&B shows the run as failed until a resume finishes it); with `out_dir`, the committed output
        keeps where it is (`wandb.json`)."""
        _finish(self._run, exit_code)
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


def held(tracking: Tracking, run, state: Mapping[str, Any]) -> int:
    """The last step W&B holds of the resumed run `run`: offline, the largest step in the run files the
    earlier segments wrote (`state["files"]`; a state written before they were recorded: its last step
    sent); online, the step before the server's starting step for the resumed run."""
    if tracking.mode == "online":
        return max(0, int(run.starting_step) - 1)
    if "files" not in state:
        return int(state["step"])
    return wandb_files.last_step(state["files"])


def _finish(run, exit_code: int = 0) -> None:
    """Ends the run and W&B's service process: an offline run's file is complete only once it has stopped
    (right after `finish()` it can still be a bare header)."""
    import wandb

    run.finish(exit_code=exit_code)
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

