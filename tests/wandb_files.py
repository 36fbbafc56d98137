"""Reads W&B offline run files back, with no network: what tests/train/test_tracking.py checks a run by.

    runs = wandb_files.read_all(wandb_dir, run_id)     # every offline-run-* of that id, oldest first

The format and its record reader are stages/train/wandb_files.py's (a resumed training reads its earlier
segments' files with it); this module turns a file's records into what a test compares. A resumed run writes a
directory of its own for the same id; the file is complete once the writing process has exited (or called
`wandb.teardown()`).
"""

from __future__ import annotations

import glob
import json
import os

from stages.train.wandb_files import records


def read(path: str) -> dict:
    """{"run": {id, name, group, project, tags, config}, "history": [rows], "config": {updates after init},
    "summary": {merged}, "exit_code": the code `finish` recorded (None: the writer never finished)} of one
    run file."""
    out = {"run": None, "history": [], "config": {}, "summary": {}, "exit_code": None}
    for r in records(path):
        kind = r.WhichOneof("record_type")
        if kind == "run":
            out["run"] = {"id": r.run.run_id, "name": r.run.display_name, "group": r.run.run_group,
                          "project": r.run.project, "tags": list(r.run.tags),
                          "start_ns": r.run.start_time.ToNanoseconds(),
                          "config": {i.key: json.loads(i.value_json) for i in r.run.config.update}}
        elif kind == "history":
            out["history"].append({_key(i): json.loads(i.value_json) for i in r.history.item})
        elif kind == "config":
            out["config"].update({i.key: json.loads(i.value_json) for i in r.config.update})
        elif kind == "summary":
            out["summary"].update({_key(i): json.loads(i.value_json) for i in r.summary.update})
        elif kind == "exit":
            out["exit_code"] = r.exit.exit_code
    return out


def read_all(wandb_dir: str, run_id: str) -> list[dict]:
    """Every offline run file of `run_id` under `wandb_dir` (W&B's `dir`), oldest first (by the start time
    the file records: two in one second are `offline-run-<second>-<id>` and `...-<id>-1`)."""
    found = glob.glob(os.path.join(wandb_dir, "wandb", f"offline-run-*-{run_id}*", f"run-{run_id}.wandb"))
    # A file W&B's service never wrote a record to (killed first) has no start time: it sorts first.
    return sorted((read(path) for path in found), key=lambda run: run["run"]["start_ns"] if run["run"] else 0)


def _key(item) -> str:
    return "/".join(item.nested_key) if item.nested_key else item.key
