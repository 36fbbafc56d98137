"""Launchers: the TPU VM command is built exactly; bad launch configs fail early."""

import pytest

from stages.train import launch


def test_tpu_vm_command_runs_the_worker_on_every_host_with_the_same_spec():
    cfg = launch.LaunchConfig(kind="tpu_vm", tpu_name="pod-v5p-128", zone="us-east5-a", project="proj",
                              remote_dir="~/refinery")
    cmd = launch.tpu_vm_command(cfg, "gs://b/cache/train/abc/work/spec.json")
    assert cmd == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "pod-v5p-128", "--zone=us-east5-a",
                   "--project=proj", "--worker=all",
                   "--command=cd ~/refinery && REFINERY_DISTRIBUTED=auto .venv/bin/python -m "
                   "stages.train.worker gs://b/cache/train/abc/work/spec.json"]


def test_tpu_vm_needs_a_spec_every_host_can_read():
    cfg = launch.LaunchConfig(kind="tpu_vm", tpu_name="t", zone="z")
    with pytest.raises(ValueError, match="point pipeline.Settings.cache_root at a Cloud Storage bucket"):
        launch.tpu_vm_command(cfg, "/tmp/cache/train/abc/work/spec.json")


@pytest.mark.parametrize("kwargs, message", [
    ({"kind": "slurm"}, "kind='slurm' is not one of ('inprocess', 'local', 'tpu_vm')"),
    ({"kind": "tpu_vm"}, "needs tpu_name and zone"),
    ({"kind": "local", "num_processes": 0}, "num_processes=0 must be >= 1"),
])
def test_bad_launch_configs(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        launch.LaunchConfig(**kwargs)


def test_local_launcher_stops_everything_when_one_process_fails(tmp_path, monkeypatch):
    # A spec that is not JSON makes every worker fail fast; the launcher must raise.
    spec = tmp_path / "spec.json"
    spec.write_bytes(b"not JSON")
    with pytest.raises(RuntimeError, match="exited with"):
        launch.run_local(2, str(spec), timeout_s=120)
