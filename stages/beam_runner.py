"""How a Beam stage runs: the runner and its pipeline options, shared by download, clean, shard.

The runner never changes what a stage computes, so `Runner` fields stay out of the cache key
(each stage declares its `runner` field with `metadata={"key": False}`).

Locally we default to `FnApiRunner`: Beam 2.77's `DirectRunner` first tries PrismRunner, a Go
binary it downloads at run time, which fails offline. On Google Cloud, include gin/data/dataflow.gin
and fill in its project and bucket:

    beam_runner.Runner.name = "DataflowRunner"
    beam_runner.Runner.project = "my-project"
    beam_runner.Runner.region = "us-central1"
    beam_runner.Runner.temp_location = "gs://my-bucket/beam-tmp"
    beam_runner.Runner.machine_type = "n2-highmem-8"
    beam_runner.Runner.max_workers = 256

Dataflow workers import this repository's stage code (the DoFns), so the package is staged to them
with `--setup_file` (this repository's setup.py, which defers to setup.cfg); `options` passes any other
`--flag=value` through.
"""

from __future__ import annotations

import dataclasses
import os

from stages.io import storage

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATAFLOW = "DataflowRunner"


@dataclasses.dataclass(frozen=True)
class Runner:
    name: str = "FnApiRunner"
    options: tuple[str, ...] = ()     # extra `--flag=value` pipeline options, passed through
    project: str = ""                 # Dataflow: the Google Cloud project, region and a bucket path for
    region: str = ""                  # Beam's temporary and staging files
    temp_location: str = ""
    machine_type: str = ""            # Dataflow: worker machine type; "" = Dataflow's default
    max_workers: int = 0              # Dataflow: the autoscaling limit; 0 = Dataflow's default
    stage_package: bool = True        # Dataflow: ship this repository to the workers (--setup_file)

    def __post_init__(self):
        if self.max_workers < 0:
            raise ValueError(f"beam_runner.Runner.max_workers={self.max_workers} must be >= 0 (0 = default)")
        if self.name == DATAFLOW:
            missing = [f for f in ("project", "region", "temp_location") if not getattr(self, f)]
            if missing:
                raise ValueError(f"beam_runner.Runner: name={DATAFLOW!r} needs {', '.join(missing)} "
                                 "(see gin/data/dataflow.gin)")
            if storage.is_local(self.temp_location):
                raise ValueError(f"beam_runner.Runner.temp_location={self.temp_location!r} is a local path; "
                                 "Dataflow workers need a Cloud Storage location")

    def unused_fields(self) -> frozenset[str]:
        """Fields this runner ignores (the placeholder check skips them): Dataflow's, when running locally."""
        dataflow = {"project", "region", "temp_location", "machine_type", "max_workers", "stage_package"}
        return frozenset() if self.name == DATAFLOW else frozenset(dataflow)

    def pipeline_options(self) -> list[str]:
        """The command-line style options Beam's `PipelineOptions` takes, for this runner."""
        out = [f"--runner={self.name}"]
        if self.name == DATAFLOW:
            out += [f"--project={self.project}", f"--region={self.region}",
                    f"--temp_location={self.temp_location}"]
            out += [f"--machine_type={self.machine_type}"] if self.machine_type else []
            out += [f"--max_num_workers={self.max_workers}"] if self.max_workers else []
            out += [f"--setup_file={os.path.join(REPO, 'setup.py')}"] if self.stage_package else []
        return out + list(self.options)


def pipeline(runner: Runner):
    """A `beam.Pipeline` for `runner`; use it as a context manager (`with pipeline(r) as p:`)."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    options = PipelineOptions(runner.pipeline_options(), save_main_session=False)
    return beam.Pipeline(options=options)
