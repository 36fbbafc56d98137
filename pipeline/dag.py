"""The stage graph: which stages exist, where their code lives, and what each one reads.

This is the one place the DAG is written down; config.py, tasks.py and the CLI derive
everything (gin names, Luigi task classes, what `--force` reruns: `forced`) from it.
"""

from __future__ import annotations

import importlib
from types import ModuleType

# stage name -> (module implementing Config / VERSION / run, upstream stage names)
STAGES: dict[str, tuple[str, tuple[str, ...]]] = {
    "download": ("stages.download", ()),
    "clean": ("stages.clean", ("download",)),
    "tokenizer": ("stages.tokenizer", ("clean",)),
    "shard": ("stages.shard", ("clean", "tokenizer")),
    # what every variant is scored on, tokenized once per tokenizer: training scores a subset in the loop
    "yardsticks": ("stages.yardsticks", ("tokenizer",)),
    # tokenizer: the one train.Config.init_from's weights need is checked against it before training
    "train": ("stages.train", ("shard", "yardsticks", "tokenizer")),
    # clean: its contamination.json (training text that holds a yardstick), reported beside the scores
    "evaluate": ("stages.evaluate", ("train", "shard", "tokenizer", "yardsticks", "clean")),
    # the model as a Hugging Face directory; the others are read for its card (and shard for bos/eos)
    "export": ("stages.export", ("train", "tokenizer", "shard", "evaluate", "clean")),
}

# What each stage's work runs on, which decides the heavy libraries it may import: only "jax" stages import
# JAX, Flax, Optax or Orbax, only "beam" stages import Apache Beam, the others neither (export reads
# checkpoints with TensorStore and writes numpy). With STAGES it gives every stage's import contract:
# setup.cfg's [importlinter] section, checked against this file by tests/test_layers.py.
RUNS_ON: dict[str, str] = {
    "download": "beam", "clean": "beam", "tokenizer": "sentencepiece", "shard": "beam",
    "yardsticks": "sentencepiece", "train": "jax", "evaluate": "jax", "export": "tensorstore",
}


def module(stage: str) -> ModuleType:
    return importlib.import_module(STAGES[stage][0])


def upstream(stage: str) -> tuple[str, ...]:
    return STAGES[stage][1]


def downstream(stage: str) -> list[str]:
    """`stage` and every stage that reads it, directly or not, in DAG order."""
    out = [stage]
    for name, (_, ups) in STAGES.items():
        if name not in out and any(u in out for u in ups):
            out.append(name)
    return out


def forced(*stages: str) -> list[str]:
    """What `--force` reruns: each of `stages` and every stage downstream of it, in DAG order. Downstream
    keys do not depend on upstream output bytes, so a forced stage's readers must rerun too, or they
    would stay cached on the output it replaced. No stages: nothing is forced."""
    out = {s for stage in stages for s in downstream(stage)}
    return [name for name in STAGES if name in out]


def closure(*stages: str) -> list[str]:
    """`stages` and everything they need, in DAG order."""
    need = set(stages)
    for name in reversed(list(STAGES)):
        if name in need:
            need.update(upstream(name))
    return [name for name in STAGES if name in need]


def sinks(stages: list[str]) -> list[str]:
    """The stages in `stages` that no other stage in it reads: building these builds them all."""
    return [s for s in stages if not any(s in upstream(other) for other in stages)]


def check_name(stage: str) -> str:
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}; stages are: {', '.join(STAGES)}")
    return stage
