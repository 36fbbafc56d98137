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

import os
import shlex
import socket
import subprocess
import sys
import time

from stages.io import storage
from stages.train.stage_config import LaunchConfig
from stages.train.stop import STOPPED_EXIT_CODE, StopRequest, TrainingStopped, stop_requests


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
    """N worker processes on this machine; if one fails the others are stopped and the error raised.

    The workers run in a process group of their own, so a stop request (SIGTERM, Ctrl-C) reaches them once,
    from here: this process passes it on and waits while they save, then raises `TrainingStopped`. They
    agree on the step to stop after (`agreed_stop.py`), so the wait ends; `timeout_s` still bounds it, and
    a second Ctrl-C here kills them at once, unsaved.
    """
    port = _free_port()
    procs = []
    with stop_requests() as stop:
        try:
            for i in range(num_processes):
                env = dict(os.environ, REFINERY_COORDINATOR=f"127.0.0.1:{port}",
                           REFINERY_NUM_PROCESSES=str(num_processes), REFINERY_PROCESS_ID=str(i))
                cmd = [sys.executable, "-m", "stages.train.worker", spec_path]
                procs.append(subprocess.Popen(cmd, env=env, process_group=0))
            _wait(procs, stop, timeout_s)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()


def _wait(procs: list[subprocess.Popen], stop: StopRequest, timeout_s: int) -> None:
    """Until every worker has exited: raises when one fails, passes a stop request on to all of them."""
    n, forwarded = len(procs), False
    deadline = time.time() + timeout_s if timeout_s else None
    while any(p.poll() is None for p in procs):
        if stop.is_set() and not forwarded:
            for p in procs:
                if p.poll() is None:
                    p.send_signal(stop.signum)
            forwarded = True
        # A stopping worker exits before the others finish saving the checkpoint: let them.
        failed = [i for i, p in enumerate(procs) if p.returncode not in (None, 0, STOPPED_EXIT_CODE)]
        if failed:
            raise RuntimeError(f"training process {failed[0]} of {n} exited with "
                               f"{procs[failed[0]].returncode}; stopping the others")
        if deadline and time.time() > deadline:
            raise TimeoutError(f"training did not finish within {timeout_s} s")
        time.sleep(0.2)
    codes = [p.returncode for p in procs]
    if set(codes) == {STOPPED_EXIT_CODE}:
        raise TrainingStopped(f"all {n} training processes stopped at a checkpoint; "
                              "rerun the stage to resume from it")
    if any(codes):
        raise RuntimeError(f"training processes exited with {codes}")


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
