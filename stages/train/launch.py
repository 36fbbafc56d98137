"""Training launchers: where the processes of one training run start.

    inprocess   the default: the training stage runs in the calling process (one host).
    local       N processes on this machine joined with `jax.distributed` over gloo: the multi-host
                code path (per-process data slices, global arrays, collectives) on one machine.
    tpu_vm      every worker of a Cloud TPU VM slice, through
                `gcloud compute tpus tpu-vm ssh NAME --worker=all --command=...`.

Each process runs `python -m stages.train.worker SPEC` where SPEC is the training stage's
`<key>/work/spec.json` (`stages/train/spec.py`: the resolved configs, the shard stage's output and the
output directory, as JSON data that no reader executes): gin never reaches workers.
A worker learns its place from `REFINERY_COORDINATOR`, `REFINERY_NUM_PROCESSES` and
`REFINERY_PROCESS_ID` (local), or from the TPU environment (`jax.distributed.initialize()` with no
arguments).
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import socket
import subprocess
import sys
import time

from stages.io import storage

KINDS = ("inprocess", "local", "tpu_vm")
STOPPED_EXIT_CODE = 75   # a worker that stopped at a checkpoint on request (EX_TEMPFAIL: rerun to resume)


class TrainingStopped(Exception):
    """Training stopped before its last step on request (SIGTERM, `train.Config.stop_after`) after saving
    a checkpoint: the attempt does not commit, and rerunning the stage resumes from that checkpoint."""

    resumable = True    # `python -m pipeline` reports it in one line, no traceback (pipeline/tasks.py)


@dataclasses.dataclass(frozen=True)
class LaunchConfig:
    kind: str = "inprocess"
    num_processes: int = 2          # local: how many processes
    tpu_name: str = ""              # tpu_vm: the slice, its zone and project
    zone: str = ""
    project: str = ""
    remote_dir: str = "~/refinery"  # tpu_vm: where this repository is checked out on every worker
    timeout_s: int = 0              # 0 = no limit

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"kind={self.kind!r} is not one of {KINDS}")
        if self.kind == "local" and self.num_processes < 1:
            raise ValueError(f"num_processes={self.num_processes} must be >= 1")
        if self.kind == "tpu_vm" and not (self.tpu_name and self.zone):
            raise ValueError("kind='tpu_vm' needs tpu_name and zone (and usually project): "
                             f"got tpu_name={self.tpu_name!r}, zone={self.zone!r}")


    def unused_fields(self) -> frozenset[str]:
        """Fields this launcher kind ignores (the placeholder check skips them)."""
        slice_fields = {"tpu_name", "zone", "project", "remote_dir"}
        return frozenset() if self.kind == "tpu_vm" else frozenset(slice_fields)


def launch(cfg: LaunchConfig, spec_path: str) -> None:
    """Runs the training worker for `spec_path` with the chosen launcher; raises if any process fails."""
    if cfg.kind == "inprocess":
        from stages.train import worker

        worker.main(spec_path)
    elif cfg.kind == "local":
        run_local(cfg.num_processes, spec_path, timeout_s=cfg.timeout_s)
    else:
        cmd = tpu_vm_command(cfg, spec_path)
        code = subprocess.run(cmd).returncode
        if code == STOPPED_EXIT_CODE:     # gcloud ssh passes the workers' exit status through
            raise TrainingStopped("the TPU workers stopped at a checkpoint; rerun the stage to resume")
        if code:
            raise subprocess.CalledProcessError(code, cmd)


def run_local(num_processes: int, spec_path: str, *, timeout_s: int = 0) -> None:
    """N worker processes on this machine; if one fails the others are stopped and the error raised."""
    port = _free_port()
    procs = []
    for i in range(num_processes):
        env = dict(os.environ, REFINERY_COORDINATOR=f"127.0.0.1:{port}",
                   REFINERY_NUM_PROCESSES=str(num_processes), REFINERY_PROCESS_ID=str(i))
        procs.append(subprocess.Popen([sys.executable, "-m", "stages.train.worker", spec_path], env=env))
    deadline = time.time() + timeout_s if timeout_s else None
    try:
        while any(p.poll() is None for p in procs):
            # A stopping worker exits before the others finish saving the checkpoint: let them.
            failed = [i for i, p in enumerate(procs) if p.returncode not in (None, 0, STOPPED_EXIT_CODE)]
            if failed:
                raise RuntimeError(f"training process {failed[0]} of {num_processes} exited with "
                                   f"{procs[failed[0]].returncode}; stopping the others")
            if deadline and time.time() > deadline:
                raise TimeoutError(f"training did not finish within {timeout_s} s")
            time.sleep(0.2)
        codes = [p.returncode for p in procs]
        if set(codes) == {STOPPED_EXIT_CODE}:
            raise TrainingStopped(f"all {num_processes} training processes stopped at a checkpoint; "
                                  "rerun the stage to resume from it")
        if any(codes):
            raise RuntimeError(f"training processes exited with {codes}")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def tpu_vm_command(cfg: LaunchConfig, spec_path: str) -> list[str]:
    """The gcloud command that starts the worker on every host of the slice (`spec_path` on gs://)."""
    if storage.is_local(spec_path):
        raise ValueError(f"a TPU slice cannot read the local file {spec_path}: point "
                         "pipeline.Settings.cache_root at a Cloud Storage bucket every host can read "
                         "for tpu_vm runs (README: On Google Cloud Storage)")
    remote = (f"cd {cfg.remote_dir} && REFINERY_DISTRIBUTED=auto "
              f".venv/bin/python -m stages.train.worker {shlex.quote(spec_path)}")
    cmd = ["gcloud", "compute", "tpus", "tpu-vm", "ssh", cfg.tpu_name, f"--zone={cfg.zone}"]
    if cfg.project:
        cmd.append(f"--project={cfg.project}")
    return cmd + ["--worker=all", f"--command={remote}"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
