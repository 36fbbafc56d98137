"""A stage for the refusal tests (tests/pipeline/test_refusals.py), without Beam or JAX: it writes `out.txt`,
or ends the way `how` says: "refuse" raises a `Refusal` as a data guard does (the tokenizer's vocabulary, the
shard stage's validation split), "crash" a RuntimeError as a bug would."""

from __future__ import annotations

import dataclasses

from stages.io import storage
from stages.io.refusal import Refusal

MESSAGE = "refusing.Config.value=3 is out of proportion to its input; set refusing.Config.value <= 2"


@dataclasses.dataclass(frozen=True)
class Config:
    how: str = "write"
    value: int = 0


CONFIGURABLES = (Config,)
VERSION = "1"


def run(config: Config, inputs, out_dir: str, work_dir: str) -> None:
    if config.how == "refuse":
        raise Refusal(MESSAGE)
    if config.how == "crash":
        raise RuntimeError("an unexpected failure in the refusing stage")
    storage.write_text(storage.join(out_dir, "out.txt"), str(config.value))
