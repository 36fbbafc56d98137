"""Gin loading on the real stages: keys move only where an override reaches, bad configs fail
early with the binding and the valid choices, the operative config is kept."""

import dataclasses

import pytest

from pipeline import config
from tests.conftest import REPO

TINY = f"{REPO}/gin/tiny.gin"


def _keys(*params):
    plan = config.load([TINY], params)
    return {name: sp.key for name, sp in plan.stages.items()}


def test_a_tokenizer_override_changes_the_keys_of_tokenizer_and_everything_after_it():
    before, after = _keys(), _keys("tokenizer.Config.vocab_size = 3000")
    assert [s for s in before if before[s] != after[s]] == ["tokenizer", "shard", "train", "evaluate"]


@pytest.mark.parametrize("binding", ["train.OptimizerConfig.learning_rate = 1e-3",
                                     "train.ModelConfig.n_layers = 2", "train.Config.steps = 70"])
def test_a_training_override_changes_the_keys_of_train_and_evaluate_only(binding):
    before, after = _keys(), _keys(binding)
    assert [s for s in before if before[s] != after[s]] == ["train", "evaluate"]


def test_how_a_run_is_launched_or_logged_is_not_part_of_any_key():
    before = _keys()
    after = _keys("train.Config.log_every = 3", "train.Config.checkpoint_every = 7",
                  'train.LaunchConfig.kind = "local"')
    assert before == after


def test_a_clean_override_changes_everything_from_clean_on():
    before, after = _keys(), _keys("clean.Config.min_chars = 50")
    changed = [s for s in before if before[s] != after[s]]
    assert changed == ["clean", "tokenizer", "shard", "train", "evaluate"]


def test_the_beam_runner_is_not_part_of_any_key():
    before = _keys()
    after = _keys("download.Config.runner = @beam_runner.Runner()",
                  'beam_runner.Runner.options = ("--direct_num_workers=2",)')
    assert before == after


def test_bindings_reach_nested_configs_left_at_their_defaults():
    plan = config.load([TINY], ['beam_runner.Runner.options = ("--direct_num_workers=2",)'])
    for stage in ("download", "clean", "shard"):
        assert plan.stages[stage].config.runner.options == ("--direct_num_workers=2",)


def test_configs_are_plain_frozen_dataclasses_with_the_bound_values():
    plan = config.load([TINY], ["tokenizer.Config.vocab_size = 3000"])
    tok = plan.stages["tokenizer"].config
    assert type(tok).__module__ == "stages.tokenizer" and tok.vocab_size == 3000
    with pytest.raises(dataclasses.FrozenInstanceError):
        tok.vocab_size = 1
    assert "tokenizer.Config.vocab_size = 3000" in plan.operative_gin


@pytest.mark.parametrize("param, message", [
    ("tokenizer.Config.vocab = 3", "tokenizer.Config has no parameter 'vocab'. Did you mean vocab_size?"),
    ("tokeniser.Config.vocab_size = 3", "unknown configurable 'tokeniser.Config'. Did you mean tokenizer.C"),
    ("tokenizer.Config.vocab_size = '30'", "tokenizer.Config.vocab_size = '30' has type str; expected int"),
    ("tokenizer.Config.model_type = 'bqe'", "tokenizer.Config: "),
    ("tokenizer.Config.model_type = bpe", "strings need quotes"),
    ("tokenizer.Config.vocab_size = %gin.REQUIRED", "tokenizer.Config.vocab_size is %gin.REQUIRED"),
    ("download.Files.paths = 3", "download.Files.paths = 3 has type int"),
])
def test_bad_bindings_fail_with_a_message_that_names_them(param, message):
    extra = ["download.Config.source = @download.Files()"] if param.startswith("download.Files") else []
    with pytest.raises(config.ConfigError) as e:
        config.load([TINY], extra + [param])
    assert message in str(e.value)


def test_a_missing_gin_file_is_named():
    with pytest.raises(config.ConfigError, match="gin file 'nope.gin' does not exist"):
        config.load(["nope.gin"])


def test_placeholders_are_asked_for_only_where_they_are_used():
    flagship = config.placeholders(config.load([f"{REPO}/gin/600b.gin"]))
    assert [line.split(" = ")[0] for line in flagship] == [
        "pipeline.Settings.cache_root", "beam_runner.Runner.project", "beam_runner.Runner.temp_location",
        "train.LaunchConfig.tpu_name", "train.LaunchConfig.project"]
    # Its twin keeps those values but runs Beam locally and trains in process: nothing to fill in.
    twin = config.load([f"{REPO}/gin/twins/600b.gin"])
    assert twin.stages["train"].config.launcher.tpu_name == "YOUR_TPU_SLICE"
    assert config.placeholders(twin) == []
