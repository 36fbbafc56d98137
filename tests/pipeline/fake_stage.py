"""A tiny stage for testing the cache and the Luigi wiring without Beam: it writes `out.txt`
holding its value and its upstream outputs, and appends its name to a log to count runs. With `reads`
(a glob) it also reads files from outside the cache, and states them for its key (`key_inputs`). With
`hold` (a directory) it writes `<hold>/<name>.reading` once it has its inputs and reads them only when
`<hold>/go` exists, so a test can act while a downstream stage is reading."""

from __future__ import annotations

import dataclasses
import time

from stages.io import storage


@dataclasses.dataclass(frozen=True)
class Config:
    value: int = 0
    fail: bool = False
    name: str = "x"
    log: str = dataclasses.field(default="", metadata={"key": False})
    reads: str = ""
    hold: str = dataclasses.field(default="", metadata={"key": False})
    sources: tuple[str, ...] = ()     # the run's sources, when this stage names them (named_sources)


def key_inputs(config: Config):
    if not config.reads:
        return None          # reads only its upstream stages: the key is as it was without the hook
    found = storage.versions(config.reads)
    if not found:
        raise ValueError(f"{config.reads!r} matches no files")
    return found


def named_sources(config: Config) -> tuple[str, ...]:
    """What makes the DAG a tree (pipeline/config.py asks every stage; train's mixture names them)."""
    return config.sources


CONFIGURABLES = (Config,)
VERSION = "1"


def run(config: Config, inputs, out_dir: str, work_dir: str) -> None:
    if config.log:
        with open(config.log, "a") as f:
            f.write(config.name + "\n")
    if config.hold:
        storage.write_text(storage.join(config.hold, f"{config.name}.reading"), "")
        while not storage.exists(storage.join(config.hold, "go")):
            time.sleep(0.05)
    up = "".join(storage.read_text(c.file("out.txt")) for _, c in sorted(inputs.items()))
    up += "".join(storage.read_text(p) for p in storage.glob(config.reads)) if config.reads else ""
    storage.write_text(storage.join(out_dir, "out.txt"), f"{up}{config.name}={config.value};")
    if config.fail:
        raise RuntimeError(f"stage {config.name} failed on purpose")
