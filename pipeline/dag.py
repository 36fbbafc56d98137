"""The stage graph: which stages exist, where their code lives, and what each one reads.

This is the one place the DAG is written down; config.py, tasks.py and the CLI derive
everything (gin names, Luigi task classes, what `--force` reruns: `forced`) from it.

A run with several sources (`train.Mixture` names them) is a tree: each source has its own instance of
every stage in PER_SOURCE, named `clean[code]`, reading that source's instances, and the stages after them
read every source's (`tree(("code", "web"))`). A one-source run is the degenerate tree, whose node names are
the stage names. The module-level functions below are that one-source tree's.

    t = tree(("code", "web"))
    t.upstream("shard[code]")        # ("clean[code]", "tokenizer")
    t.upstream("tokenizer")          # ("clean[code]", "clean[web]")
    t.forced("clean[code]")          # clean[code], shard[code], train, evaluate, export: never web's
"""

from __future__ import annotations

import dataclasses
import importlib
from types import ModuleType

from stages.io import committed

# stage name -> (module implementing Config / VERSION / run, upstream stage names)
STAGES: dict[str, tuple[str, tuple[str, ...]]] = {
    "download": ("stages.download", ()),
    # every document measured once (filters' statistics, duplicate keys, MinHash, contamination, model scores)
    # a fastText quality classifier (DCLM's recipe) trained on two named sources, or a published one: off
    # unless classifier.Config names them; its probability becomes the score table's `quality` column
    "classifier": ("stages.classifier", ()),
    "score": ("stages.score", ("download", "classifier")),
    # bits per byte of every scored document under the reference model (REFERENCE below: train and tokenizer
    # are the reference run's); only in a run that selects by it (OPTIONAL)
    "perplexity": ("stages.perplexity", ("score", "train", "tokenizer")),
    # selection: the thresholds over score's table, dedup among the survivors, the contamination drop
    "clean": ("stages.clean", ("score", "perplexity")),
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

# A stage whose code is, in part, another stage's: score measures with clean's filters, normalization,
# MinHash and contamination index (the same code must measure what clean decides on, so the two nodes of
# cleaning share one package). Its import contract allows that stage besides those it reads
# (tests/test_layers.py). The classifier reads its two classes with download's source readers and checks its
# positives with clean's contamination index (and so sits with the Beam stages in RUNS_ON: clean's config
# names Beam's runner; fastText does its work).
SHARES_CODE: dict[str, tuple[str, ...]] = {"score": ("clean",), "classifier": ("download", "clean")}

# The modules of another stage that a stage's code may import: each only to read an output of a stage it reads
# (dag.upstream), and each with the reason it exists. No other module of the stages it reads does it import
# itself (what a named module imports is that stage's business), and no stage it does not read does it reach
# at all. The rest of what it reads it reads through the manifest (stages/io/committed.py), not with their
# code: evaluate reads clean, shard and tokenizer and imports none of them. An entry naming a stage's package
# (`stages.yardsticks`) allows that package's own module, its public face, and nothing under it; one naming
# a module (`stages.train.scoring`) allows that module and, should it become a package, everything in it, so
# moving a module it does not name changes nothing here. SHARES_CODE's stages are allowed whole, beside these.
# tests/test_layers.py derives each stage's import contracts from this and STAGES, and fails when the code
# imports a module not listed here or no longer imports one that is.
IMPORTS: dict[str, dict[str, str]] = {
    "score": {
        "stages.classifier": "classifier.scorer: the committed quality model, loaded to score documents"},
    "clean": {
        "stages.score.table": "the score tables' files, schema and reader: what selection decides on",
        "stages.score.graph": "clean.run given download's output scores it first (cleaning as one stage)",
        "stages.perplexity.column": "the bits-per-byte column's files and reader (KeepTop.score='bpb')"},
    "perplexity": {
        "stages.score.table": "the score tables' documents, the ones it measures",
        "stages.train.trained": "the reference model restored from train's committed checkpoint",
        "stages.train.scoring": "the packed scorer: bits per byte as training's own yardsticks score it",
        "stages.train.native": "JAX's platforms started quietly (one line, not libtpu's dozen)"},
    "train": {
        "stages.tokenizer": "tokenizer.pretrained_file: whose pieces init_from's checkpoint must match",
        "stages.yardsticks.tokenized": "the tokenized yardsticks' files and reader, scored in the loop",
        "stages.yardsticks.score": "the yardsticks' scores, in the loop as evaluation computes them"},
    "evaluate": {
        "stages.train.trained": "the model restored from train's committed checkpoint",
        "stages.train.model_config": "ModelConfig, as training wrote it into summary.json",
        "stages.train.data": "the validation windows, batched as training batches them",
        "stages.train.step": "the loss as training computes it (step.forward_loss)",
        "stages.train.scoring": "the packed scorer, the one training scores its in-loop yardsticks with",
        "stages.train.native": "JAX's platforms started quietly (one line, not libtpu's dozen)",
        "stages.yardsticks": "MAX_LENGTH: where a task request is cut, the yardsticks stage's default",
        "stages.yardsticks.tokenized": "the tokenized yardsticks' files and reader",
        "stages.yardsticks.score": "the yardsticks' scores, computed as training computes them in the loop"},
    "export": {
        "stages.train.hf": "the model as transformers names it: config.json and the tensors' names",
        "stages.train.model_config": "ModelConfig, its parameter layout and counts, as training wrote them",
        "stages.train.checkpoint_arrays": "the checkpoint's arrays, read with TensorStore (no JAX)"},
}

# What each stage's work runs on, which decides the heavy libraries it may import: only "jax" stages import
# JAX, Flax, Optax or Orbax, only "beam" stages import Apache Beam, the others neither (export reads
# checkpoints with TensorStore and writes numpy). With STAGES it gives every stage's import contract:
# setup.cfg's [importlinter] section, checked against this file by tests/test_layers.py.
RUNS_ON: dict[str, str] = {
    "download": "beam", "classifier": "beam", "score": "beam", "perplexity": "jax", "clean": "beam",
    "tokenizer": "sentencepiece",
    "shard": "beam",
    "yardsticks": "sentencepiece", "train": "jax", "evaluate": "jax", "export": "tensorstore",
}


# The stages each source has its own instance of: what it reads, how it is cleaned, its tokens in shards.
# The tokenizer is one for all (trained on a sample of every source), and so is everything after the shards.
PER_SOURCE = ("download", "score", "perplexity", "clean", "shard")

# A model feeding a data stage. A run that selects documents by a reference model's perplexity
# (clean.KeepTop.score = "bpb") holds a second, smaller run: the reference model's, every stage training
# needs, each a node `<stage>[reference]` configured in gin scope `reference`
# (`reference/download.Config.source = ...`, `reference/train.Config.steps = ...`; unscoped bindings apply
# unless the scope overrides them), reading its own chain by stage name, so its keys are those of a one-source
# run of that configuration. The stages in READS_REFERENCE read those nodes (perplexity: the reference's train
# and tokenizer), and OPTIONAL stages exist only in such a run; without one, the tree and every key are what
# they were before perplexity existed.
REFERENCE = committed.REFERENCE
READS_REFERENCE: dict[str, tuple[str, ...]] = {"perplexity": ("train", "tokenizer")}
OPTIONAL = ("perplexity",)


def module(stage: str) -> ModuleType:
    """The module of a stage, or of the stage a node is an instance of (`clean[code]`: stages.clean)."""
    return importlib.import_module(STAGES[stage_of(stage)][0])


# `clean[code]` -> `clean`, `code`; (`clean`, `code`) -> `clean[code]`
stage_of, source_of, node_name = committed.stage_of, committed.source_of, committed.node_name


@dataclasses.dataclass(frozen=True)
class Tree:
    """The nodes of one run, in DAG order: each node -> (its stage, the nodes it reads). Every function of
    this module has a method here that works on node names."""

    sources: tuple[str, ...]
    nodes: dict[str, tuple[str, tuple[str, ...]]]

    def upstream(self, node: str) -> tuple[str, ...]:
        return self.nodes[node][1]

    def downstream(self, node: str) -> list[str]:
        """`node` and every node that reads it, directly or not, in DAG order."""
        out = [node]
        for name, (_, ups) in self.nodes.items():
            if name not in out and any(u in out for u in ups):
                out.append(name)
        return out

    def forced(self, *nodes: str) -> list[str]:
        """What `--force` reruns: each of `nodes` and every node downstream of it, in DAG order. Downstream
        keys do not depend on upstream output bytes, so a forced node's readers must rerun too, or they
        would stay cached on the output it replaced. No nodes: nothing is forced."""
        out = {d for node in nodes for d in self.downstream(node)}
        return [name for name in self.nodes if name in out]

    def closure(self, *nodes: str) -> list[str]:
        """`nodes` and everything they need, in DAG order."""
        need = set(nodes)
        for name in reversed(list(self.nodes)):
            if name in need:
                need.update(self.upstream(name))
        return [name for name in self.nodes if name in need]

    def sinks(self, nodes: list[str] | None = None) -> list[str]:
        """The nodes in `nodes` (default: all) that no other node in it reads: building these builds them
        all."""
        nodes = list(self.nodes) if nodes is None else nodes
        return [n for n in nodes if not any(n in self.upstream(other) for other in nodes)]

    def select_all(self, names) -> list[str]:
        """`select` of each of `names`, in order, each node once; None: the sinks, which build every node."""
        if names is None:
            return self.sinks()
        return list(dict.fromkeys(node for name in names for node in self.select(name)))

    def select(self, name: str) -> list[str]:
        """The nodes a `--stage` argument names: a node (`clean[code]`, or `tokenizer`), or a stage, which
        names every source's instance of it (`clean`: clean[code] and clean[web]). ValueError naming the
        valid choices otherwise."""
        if name in self.nodes:
            return [name]
        if found := [n for n, (stage, _) in self.nodes.items() if stage == name]:
            return found
        raise ValueError(f"unknown stage {name!r}; stages are: {', '.join(self.nodes)}"
                         + (f" (or a stage's name for every source's: {', '.join(PER_SOURCE)})"
                            if self.sources else ""))

    def input_names(self, node: str) -> dict[str, str]:
        # (the reference run's nodes are read by stage name, as a one-source run reads them)
        """Each node `node` reads -> the name its stage sees it by (the `inputs` key of `run`, and the
        upstream name its cache key covers): the stage's name, unless `node` is not a source's own and reads
        every source's instance of it (the tokenizer reads clean[code] and clean[web] by those names; in a
        mixture of one source, clean[web] alone, so training finds the source its mixture weighs). So a
        source's own chain has the keys it would have in a one-source run of that source."""
        return {u: (u if source_of(u) and source_of(u) != REFERENCE and not source_of(node) else stage_of(u))
                for u in self.upstream(node)}


def tree(sources: tuple[str, ...] = (), reference: bool = False) -> Tree:
    """The nodes of a run with these sources (none: the one-source run, each stage its own node); with
    `reference`, the reference model's run first (REFERENCE) and the OPTIONAL stages that read it."""
    def instances(stage: str, source: str) -> tuple[str, ...]:
        if stage not in PER_SOURCE or not sources:
            return (stage,)
        return (node_name(stage, source),) if source else tuple(node_name(stage, s) for s in sources)

    def present(stage: str) -> bool:
        return reference or stage not in OPTIONAL

    nodes: dict[str, tuple[str, tuple[str, ...]]] = {}
    if reference:
        chain = set(reference_chain())
        for stage, (_, ups) in STAGES.items():
            if stage in chain:
                nodes[node_name(stage, REFERENCE)] = (stage, tuple(node_name(u, REFERENCE) for u in ups
                                                                   if u in chain))
    for stage, (_, ups) in STAGES.items():
        if not present(stage):
            continue
        for source in (sources if stage in PER_SOURCE and sources else ("",)):
            reads = []
            for u in ups:
                if u in READS_REFERENCE.get(stage, ()):
                    reads.append(node_name(u, REFERENCE))
                elif present(u):
                    reads.extend(instances(u, source))
            nodes[node_name(stage, source)] = (stage, tuple(reads))
    return Tree(tuple(sources), nodes)


def reference_chain() -> list[str]:
    """The stages of the reference run, in DAG order: what the stages READS_REFERENCE names need, less the
    OPTIONAL ones (the reference's own data is not selected by a reference)."""
    need = {u for ups in READS_REFERENCE.values() for u in ups}
    for stage in reversed(list(STAGES)):
        if stage in need:
            need.update(u for u in STAGES[stage][1] if u not in OPTIONAL)
    return [s for s in STAGES if s in need]


def upstream(stage: str) -> tuple[str, ...]:
    return STAGES[stage][1]


def downstream(stage: str) -> list[str]:
    return tree().downstream(stage)


def forced(*stages: str) -> list[str]:
    return tree().forced(*stages)


def closure(*stages: str) -> list[str]:
    return tree().closure(*stages)


def sinks(stages: list[str]) -> list[str]:
    return tree().sinks(stages)


def check_name(stage: str) -> str:
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}; stages are: {', '.join(STAGES)}")
    return stage
