"""A model feeding a data stage: selecting documents by a reference model's bits per byte.

    .venv/bin/python -m pytest -q tests/pipeline/test_reference_model.py

`clean.KeepTop.score = "bpb"` puts the reference model's run in the tree (pipeline/dag.py REFERENCE: every
stage training needs, as nodes `<stage>[reference]` configured in gin scope `reference`), and a perplexity
node per source between score and clean. Counted stage runs and the kept documents, on the tiny run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from pipeline import config, dag
from stages.clean import select
from stages.io import documents, storage
from stages.perplexity import column
from stages.score import table
from tests.conftest import REPO
from tests.tiny_run import SMALL

TINY = f"{REPO}/gin/tiny.gin"
# The main source and the reference's differ: the reference trains on fewer modules' docstrings.
BY_BPB = [*SMALL, "clean.Config.keep_top = @clean.KeepTop()", "clean.KeepTop.score = 'bpb'",
          "clean.KeepTop.keep_fraction = 0.5", "reference/download.Embedded.max_files = 30"]


def test_selecting_by_bpb_puts_the_reference_run_in_the_tree_keyed_as_a_run_of_its_own():
    plan = config.load([TINY], BY_BPB)
    reference = [n for n in plan.stages if dag.source_of(n) == dag.REFERENCE]
    assert reference == [f"{s}[reference]" for s in dag.reference_chain()]
    assert plan.tree.upstream("perplexity") == ("score", "train[reference]", "tokenizer[reference]")
    assert plan.tree.upstream("clean") == ("score", "perplexity")
    # the reference's train is the train of a one-source run of its configuration: one cache entry for both
    alone = config.load([TINY], [*SMALL, "download.Embedded.max_files = 30"])
    assert plan.stages["train[reference]"].key == alone.stages["train"].key
    # without a ranking by bpb: no reference, no perplexity, and the keys of a run without them
    plain = config.load([TINY], SMALL)
    assert not any(dag.source_of(n) == dag.REFERENCE or n == "perplexity" for n in plain.stages)
    with pytest.raises(config.ConfigError, match=r"part of a run only when a clean.KeepTop ranks"):
        config.load([TINY], [*SMALL, "reference/train.Config.steps = 3"])      # a reference nothing reads
    with pytest.raises(config.ConfigError, match="reference/train.Config.mixture = None"):
        config.load(["gin/mixtures/prose_code.gin"], ["code/clean.Config.keep_top = @clean.KeepTop()",
                                                     "code/clean.KeepTop.score = 'bpb'",
                                                     "code/clean.KeepTop.keep_fraction = 0.5"])


def _run(root, *overrides):
    done = subprocess.run([sys.executable, "-m", "pipeline", "run", "--gin", TINY, "--stage", "clean",
                           "--overrides", " ".join([f"pipeline.Settings.cache_root = '{root}'", *overrides])],
                          cwd=REPO, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]


def _attempts(root) -> dict[str, int]:
    return {stage: sum(len([a for a in os.listdir(root / stage / key) if a.startswith("attempt-")])
                       for key in os.listdir(root / stage)) for stage in os.listdir(root)
            if (root / stage).is_dir()}


@pytest.mark.optimized      # trains long enough that XLA's optimized code pays (tests/jax_env.py)
def test_clean_keeps_the_half_the_reference_model_finds_likeliest_and_a_new_fraction_reruns_clean_alone(
        tmp_path):
    root = tmp_path / "cache"
    params = [p.replace(" ", "") if p.startswith("reference/") else p for p in BY_BPB]
    _run(root, *params)
    first = _attempts(root)
    assert first["perplexity"] == 1 and first["train"] == 1       # the reference's training, and no other
    plan = config.load([TINY], [*BY_BPB, f"pipeline.Settings.cache_root = '{root}'"])
    scored, bpb, cleaned = (plan.committed(n) for n in ("score", "perplexity", "clean"))
    tables, columns = table.shards_of(scored), bpb.paths(column.SHARDS)
    assert len(tables) == len(columns)
    survivors = select.survivors(plan.stages["clean"].config, tables, columns)
    values = sorted(rank[0] for rank, _ in survivors)              # bpb (rank: -score = bpb), lowest first
    k = select.count(0.5, len(values))
    stats = json.loads(storage.read_text(cleaned.file("stats.json")))
    assert stats["dropped"]["high_bpb"] == len(values) - k and k > 20
    by_id = {i: b for path in columns for i, b in zip(*column.read(path))}
    kept = [by_id[d["id"]] for path in documents.shards_of(cleaned) for d in documents.read(path)]
    assert kept and max(kept) <= values[k - 1] and np.isfinite(kept).all()
    # another fraction: clean reruns; the reference model, its scores and every table are reused
    _run(root, *[p.replace("0.5", "0.3") for p in params])
    second = _attempts(root)
    assert second == {**first, "clean": first["clean"] + 1}
