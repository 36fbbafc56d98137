"""The whole data half (download -> clean -> tokenizer -> shard) on a small slice of the
embedded corpus, locally and with the cache on a real GCS emulator."""

import numpy as np
import pytest

from pipeline import __main__ as cli
from pipeline import cache, config, storage
from stages.shard import llmc
from tests.conftest import REPO

SMALL = [
    "download.Embedded.max_files = 60",
    "tokenizer.Config.vocab_size = 800",
    "shard.Config.tokens_per_shard = 20_000",
]


def _argv(root, *extra):
    return ["--gin", f"{REPO}/gin/tiny.gin", "--gin-param", f'pipeline.Settings.cache_root = "{root}"',
            *[a for p in SMALL + list(extra) for a in ("--gin-param", p)]]


def _ran(capsys):
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[1:]]
    return [row[0] for row in rows if len(row) > 2 and row[2] == "ran"]


def _check_outputs(root, extra=()):
    params = [f'pipeline.Settings.cache_root = "{root}"', *SMALL, *extra]
    plan = config.load([f"{REPO}/gin/tiny.gin"], params)
    done = {s: cache.load(plan.cache_root, s, sp.key) for s, sp in plan.stages.items()}
    assert all(done.values()), done
    clean_stats = storage.read_json(done["clean"].file("stats.json"))
    assert clean_stats["docs_kept"] > 100
    manifest = storage.read_json(done["shard"].file("manifest.json"))
    train = done["shard"].paths("train-*.bin")
    assert train and done["shard"].paths("val-*.bin")
    with storage.local_copy(train[0]) as local:
        tokens = llmc.read(local)
    assert tokens.dtype == np.uint16 and len(tokens) > 0
    assert int(tokens.max()) < manifest["vocab_size"]
    assert (tokens == manifest["eos_id"]).sum() > 0
    return plan


@pytest.mark.slow
def test_data_half_locally_with_reruns_overrides_and_force(tmp_path, capsys):
    root = str(tmp_path / "cache")
    assert cli.main(["run", *_argv(root)]) == 0
    assert _ran(capsys) == ["download", "clean", "tokenizer", "shard"]
    _check_outputs(root)

    assert cli.main(["run", *_argv(root)]) == 0
    assert _ran(capsys) == []

    assert cli.main(["run", *_argv(root, "tokenizer.Config.vocab_size = 700")]) == 0
    assert _ran(capsys) == ["tokenizer", "shard"]
    _check_outputs(root, ["tokenizer.Config.vocab_size = 700"])

    assert cli.main(["run", "--stage", "tokenizer", "--force", *_argv(root)]) == 0
    assert _ran(capsys) == ["tokenizer", "shard"]


@pytest.mark.slow
@pytest.mark.gcs
def test_data_half_with_the_cache_on_gcs(gcs_bucket, capsys):
    root = f"{gcs_bucket}/refinery"
    assert cli.main(["run", *_argv(root)]) == 0
    assert _ran(capsys) == ["download", "clean", "tokenizer", "shard"]
    plan = _check_outputs(root)
    assert plan.cache_root == root
    assert cli.main(["run", *_argv(root)]) == 0
    assert _ran(capsys) == []
