"""The Beam runner's options: local by default; Dataflow's built from gin and checked without a network."""

import os

import pytest
from apache_beam.options.pipeline_options import (
    GoogleCloudOptions,
    PipelineOptions,
    SetupOptions,
    StandardOptions,
    TypeOptions,
    WorkerOptions,
)

from pipeline import config
from stages import beam_runner
from tests.conftest import REPO

FILLED = ['beam_runner.Runner.project = "my-project"',
          'beam_runner.Runner.temp_location = "gs://my-bucket/beam-tmp"']


def test_the_default_runs_in_process():
    options = beam_runner.Runner().pipeline_options()
    assert options == ["--runner=FnApiRunner", "--no_pipeline_type_check"]
    assert not PipelineOptions(options).view_as(TypeOptions).pipeline_type_check     # nothing to check


def test_dataflow_gin_builds_real_dataflow_options():
    plan = config.load([f"{REPO}/gin/data/fineweb.gin", f"{REPO}/gin/data/dataflow.gin"], FILLED)
    runner = plan.stages["download"].config.runner
    assert runner == plan.stages["clean"].config.runner == plan.stages["shard"].config.runner
    options = PipelineOptions(runner.pipeline_options())
    assert options.view_as(StandardOptions).runner == "DataflowRunner"
    cloud = options.view_as(GoogleCloudOptions)
    assert (cloud.project, cloud.region, cloud.temp_location) == ("my-project", "us-central1",
                                                                  "gs://my-bucket/beam-tmp")
    workers = options.view_as(WorkerOptions)
    assert (workers.machine_type, workers.max_num_workers) == ("n2-highmem-8", 256)
    setup_file = options.view_as(SetupOptions).setup_file
    assert setup_file == os.path.join(REPO, "setup.py") and os.path.exists(setup_file)
    assert "use_runner_v2" in options.get_all_options()["experiments"]
    assert options.view_as(TypeOptions).pipeline_type_check     # Dataflow's coders follow the inferred types


@pytest.mark.parametrize(("fields", "message"), [
    ({"project": ""}, "needs project"),
    ({"temp_location": "/tmp/beam"}, "is a local path; Dataflow workers need a Cloud Storage location"),
    ({"max_workers": -1}, "max_workers=-1 must be >= 0"),
])
def test_bad_dataflow_settings_are_named(fields, message):
    good = {"name": "DataflowRunner", "project": "p", "region": "r", "temp_location": "gs://b/t"}
    with pytest.raises(ValueError, match=message):
        beam_runner.Runner(**(good | fields))
