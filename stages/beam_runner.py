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

On one machine with several cores, include gin/data/local_workers.gin (or bind `local_workers`): the
`FnApiRunner` then runs each stage's bundles on that many worker processes
(`--direct_num_workers=N --direct_running_mode=multi_processing`, each worker a
`python -m apache_beam.runners.worker.sdk_worker_main` process), with outputs byte-identical to one
process's (tests/pipeline/test_output_is_the_key.py). Why this runner: Beam's other local ones either run
in this process (the PortableRunner's LOOPBACK environment executes the bundles in the submitting process,
so it adds no process), need a binary from outside the package registries (Prism, Flink, Spark), or compute
the wrong thing (the Dask runner computes only the last output of a graph and sends every element of a
multi-output ParDo to every output).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import tempfile

from stages.io import storage

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATAFLOW = "DataflowRunner"
# Locally, Beam's construction-time type inference and checks are off: the stages declare no type hints, so
# they check nothing, and each check re-parses the pipeline options (1.3 s of checks over tests/stages/
# test_clean.py's 10 pipelines). Dataflow keeps them: its coders follow the inferred types.
# benchmarks/RESULTS.md, "XLA:CPU's emitters under the tests", has the figures.
NO_TYPE_INFERENCE = "--no_pipeline_type_check"


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
    local_workers: int = 0            # FnApiRunner: bundles on this many local processes; 0: in this one

    def __post_init__(self):
        if self.max_workers < 0:
            raise ValueError(f"beam_runner.Runner.max_workers={self.max_workers} must be >= 0 (0 = default)")
        if self.local_workers < 0:
            raise ValueError(f"beam_runner.Runner.local_workers={self.local_workers} must be >= 0 (0: the "
                             "stage's own process)")
        if self.local_workers and self.name != "FnApiRunner":
            raise ValueError(f"beam_runner.Runner.local_workers={self.local_workers} runs the FnApiRunner on "
                             f"local processes; name={self.name!r} is not it (Dataflow scales its own "
                             "workers: max_workers)")
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
        return frozenset({"local_workers"}) if self.name == DATAFLOW else frozenset(dataflow)

    def pipeline_options(self) -> list[str]:
        """The command-line style options Beam's `PipelineOptions` takes, for this runner."""
        out = [f"--runner={self.name}"]
        if self.name == DATAFLOW:
            out += [f"--project={self.project}", f"--region={self.region}",
                    f"--temp_location={self.temp_location}"]
            out += [f"--machine_type={self.machine_type}"] if self.machine_type else []
            out += [f"--max_num_workers={self.max_workers}"] if self.max_workers else []
            out += [f"--setup_file={os.path.join(REPO, 'setup.py')}"] if self.stage_package else []
        if self.local_workers:
            out += [f"--direct_num_workers={self.local_workers}", "--direct_running_mode=multi_processing"]
        if self.name != DATAFLOW:
            out.append(NO_TYPE_INFERENCE)
        return out + list(self.options)


@contextlib.contextmanager
def spill_dir(runner: Runner, stage: str, work_dir: str | None = None):
    """A local scratch directory for what a stage's groups would otherwise hold in memory (Beam's local
    runners keep a GroupByKey's whole input until the next step runs), deleted when the block ends; None on
    Dataflow, whose shuffle keeps the groups on its own disks. Inside the stage's `work_dir` when that is a
    local path (the cache's disk, which holds the corpus anyway), else in the system's temporary directory
    (which may be a tmpfs, in memory: what the spill is for would be lost)."""
    if runner.name == DATAFLOW:
        yield None
        return
    parent = storage.local_path(work_dir) if work_dir and storage.is_local(work_dir) else None
    if parent:
        os.makedirs(parent, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"refinery-{stage}-spill-", dir=parent) as directory:
        yield directory


def pipeline(runner: Runner):
    """A `beam.Pipeline` for `runner`; use it as a context manager (`with pipeline(r) as p:`)."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    options = PipelineOptions(runner.pipeline_options(), save_main_session=False)
    return beam.Pipeline(options=options)
