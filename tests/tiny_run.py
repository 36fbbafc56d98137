"""The tiny DAG that tests share: `SMALL` (a slice of the embedded corpus and a few training steps on
gin/tiny.gin), and one whole run of it per test session (the `tiny_run` fixture, tests/conftest.py) whose
commits a test copies into its own cache instead of computing them again.

A commit is a function of its key and the cache is relocatable (a manifest names its attempt relative to the
key's directory), so a copied stage is exactly what the test would have computed; the tests that a stage's
outputs are a function of its key (tests/pipeline/test_output_is_the_key.py) and the fault harness's
comparisons with an undisturbed run check that premise.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os

from pipeline import cache, config
from stages.io import storage
from stages.io.committed import Committed, stage_of

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GIN = os.path.join(REPO, "gin", "tiny.gin")
# What evaluation and the yardsticks cost, cut to what runs that train a few steps check; shared by SMALL and
# the other tests' small runs (tests/stages/test_warc.py, tests/pipeline/test_sweep_fineweb_recipe.py)
SCORING = [
    "evaluate.Config.max_new_tokens = 6",
    "evaluate.Config.max_eval_batches = 2",
    # What evaluation compiles, cut to what these tests check (that it runs and writes its files; the numbers
    # are tests/stages/test_evaluate.py's, at the defaults): one prompt, one decoder program for its prefill
    # and one for its steps, not three of each (the KV cache is as long as each prompt); requests of at most
    # 256 tokens (the context cut from the left, lm-eval's rule): rows 64, 128 and 256 wide, not 512 too
    # (the longest answer of these items is 160 tokens: 256 holds every one, none refused)
    'evaluate.Config.prompts = ("The",)',
    "evaluate.Config.max_length = 256",
    # What the yardsticks score, cut to what these runs check (that training and evaluation score them and
    # write their files; the numbers are tests/stages/test_yardsticks.py's and test_evaluate.py's): the
    # tiny model's scoring costs more than its 12 steps of training (the mixture's 4 held-out code modules
    # are 97 KB, about 5x the text its 12 steps train on), so the loop scores 5 items a task and one
    # document of each reference set, evaluation 10 items a task and 12 documents
    "yardsticks.Config.max_items_per_task = 10",
    "yardsticks.Config.max_reference_docs = 12",
    "yardsticks.Config.in_loop_items_per_task = 5",
    "yardsticks.Config.in_loop_reference_docs = 1",
]
SMALL = [
    "download.Embedded.max_files = 60",
    "tokenizer.Config.vocab_size = 800",
    "shard.Config.tokens_per_shard = 20_000",
    "train.Config.steps = 12",
    "train.Config.global_batch = 4",
    "train.Config.seq_len = 64",
    "train.Config.eval_every = 6",
    "train.Config.log_every = 3",
    "train.Config.checkpoint_every = 6",
    "train.OptimizerConfig.warmup_steps = 2",
    *SCORING,
]
ALL = ["download", "classifier", "score", "clean", "tokenizer", "shard", "yardsticks", "train", "evaluate",
       "export"]
# The prose + code mixture at the same sizes, with 24 code modules and 4 held-out ones, no downstream tasks
# (the one-source tests score them): tests/test_mixture_end_to_end.py, and the fault harness's mixture cases
MIX_GIN = os.path.join(REPO, "gin", "mixtures", "prose_code.gin")
MIX_SMALL = [*SMALL, "code/download.EmbeddedCode.max_files = 24",
             "stdlib_code/download.EmbeddedCode.max_files = 4", "yardsticks.Config.tasks = ()"]


@dataclasses.dataclass(frozen=True)
class Spec:
    """A run file and its test-size bindings: what a command line needs, given a cache root."""

    gin: str
    params: tuple[str, ...]

    def with_params(self, *extra: str) -> Spec:
        return Spec(self.gin, self.params + extra)

    def argv(self, root: str, *extra: str) -> list[str]:
        """`python -m pipeline <verb>` arguments (after the verb) on cache `root`."""
        return ["--gin", self.gin, "--gin-param", f'pipeline.Settings.cache_root = "{root}"',
                *[a for p in self.params + extra for a in ("--gin-param", p)]]

    def plan(self, root: str, *extra: str) -> config.Plan:
        return config.load([self.gin], [f'pipeline.Settings.cache_root = "{root}"', *self.params, *extra])


TINY = Spec(GIN, tuple(SMALL))
MIXTURE = Spec(MIX_GIN, tuple(MIX_SMALL))


def argv(root: str, *extra: str) -> list[str]:
    """`python -m pipeline run` arguments (after the verb) for the tiny DAG on cache `root`."""
    return TINY.argv(root, *extra)


def plan(root: str, *extra: str) -> config.Plan:
    return TINY.plan(root, *extra)


def ran(out: str) -> list[str]:
    """The stages a run's status table (its stdout) says ran, in order."""
    rows = [line.split() for line in out.splitlines()[1:]]
    return [row[0] for row in rows if len(row) > 2 and row[2] == "ran"]


@dataclasses.dataclass(frozen=True)
class TinyRun:
    """A whole run of `spec` (by default the tiny DAG) on `root`, not written to after: tests copy from it."""

    root: str
    ran: list[str]       # what the run ran: every stage, the cache being fresh
    spec: Spec = TINY

    def committed(self, *nodes: str) -> list[Committed]:
        p = self.spec.plan(self.root)
        return [cache.load(self.root, stage_of(n), p.stages[n].key) for n in nodes]

    def copy_to(self, root: str, nodes: tuple[str, ...] | None = None) -> None:
        """Puts this run's commits of `nodes` (default: every node training reads, the data half) into cache
        `root` (any storage), as a run would have."""
        if nodes is None:
            nodes = tuple(n for n in self.spec.plan(self.root).tree.closure("train") if n != "train")
        copy_commits(root, self.committed(*nodes))


def run_tiny(root: str) -> TinyRun:
    from pipeline import __main__ as cli

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli.main(["run", *argv(root)])
    if code != 0:
        raise RuntimeError(f"the shared tiny run failed (exit {code}):\n{out.getvalue()[-3000:]}")
    return TinyRun(root, ran(out.getvalue()))


def copy_commits(root: str, commits: list[Committed]) -> None:
    """Copies each local commit's key directory (its attempt, its lease records, and its manifest last, as a
    run writes it) into the cache `root` (any storage) under the same stage and key: a forced run then
    finds the lease numbers the commit was made under, as it would have in the original cache."""
    for c in commits:
        source, key_dir = storage.parent(c.path), cache.stage_dir(root, c.stage, c.key)
        names = sorted(storage.sizes(source), key=lambda name: name == cache.MANIFEST)
        for name in names:
            storage.upload(storage.join(source, name), storage.join(key_dir, name))
