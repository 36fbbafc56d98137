"""How a Beam stage runs: the runner and its pipeline options, shared by download, clean, shard.

The runner never changes what a stage computes, so `Runner` fields stay out of the cache key
(each stage declares its `runner` field with `metadata={"key": False}`).

Locally we default to `FnApiRunner`: Beam 2.77's `DirectRunner` first tries PrismRunner, a Go
binary it downloads at run time, which fails offline. On Google Cloud set, in gin:

    download.Config.runner = @beam_runner.Runner()
    beam_runner.Runner.name = "DataflowRunner"
    beam_runner.Runner.options = ("--project=my-project", "--region=us-central1",
                                  "--temp_location=gs://my-bucket/tmp")
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Runner:
    name: str = "FnApiRunner"
    options: tuple[str, ...] = ()     # extra `--flag=value` pipeline options, passed through


def pipeline(runner: Runner):
    """A `beam.Pipeline` for `runner`; use it as a context manager (`with pipeline(r) as p:`)."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    options = PipelineOptions(list(runner.options), runner=runner.name, save_main_session=False)
    return beam.Pipeline(options=options)
