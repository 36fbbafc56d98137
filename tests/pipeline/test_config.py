"""Gin loading on the real stages: keys move only where an override reaches, bad configs fail
early with the binding and the valid choices, the operative config is kept."""

import dataclasses

import pytest

from pipeline import config, gin_errors
from tests.conftest import REPO

TINY = f"{REPO}/gin/tiny.gin"


def _keys(*params):
    plan = config.load([TINY], params)
    return {name: sp.key for name, sp in plan.stages.items()}


def test_a_tokenizer_override_changes_the_keys_of_tokenizer_and_everything_after_it():
    before, after = _keys(), _keys("tokenizer.Config.vocab_size = 3000")
    assert [s for s in before if before[s] != after[s]] == ["tokenizer", "shard", "yardsticks", "train",
                                                            "evaluate", "export"]


@pytest.mark.parametrize("binding", ["train.OptimizerConfig.learning_rate = 1e-3",
                                     "train.ModelConfig.n_layers = 2", "train.Config.steps = 70"])
def test_a_training_override_changes_the_keys_of_train_evaluate_and_export_only(binding):
    before, after = _keys(), _keys(binding)
    assert [s for s in before if before[s] != after[s]] == ["train", "evaluate", "export"]


def test_how_a_run_is_launched_or_logged_is_not_part_of_any_key():
    before = _keys()
    after = _keys("train.Config.log_every = 3", "train.Config.checkpoint_every = 7",
                  'train.LaunchConfig.kind = "local"')
    assert before == after


def test_a_clean_override_changes_everything_from_clean_on():
    before, after = _keys(), _keys("clean.Config.min_chars = 50")
    changed = [s for s in before if before[s] != after[s]]
    assert changed == ["clean", "tokenizer", "shard", "yardsticks", "train", "evaluate", "export"]


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


def _load_error(tmp_path, text: str, *params: str) -> str:
    path = tmp_path / "run.gin"
    path.write_text(text)
    with pytest.raises(config.ConfigError) as e:
        config.load([str(path)], params)
    assert "\n" not in str(e.value)
    return str(e.value)


def test_a_missing_include_names_the_including_file_its_line_and_where_includes_are_looked_up(tmp_path):
    error = _load_error(tmp_path, "# a run\ninclude 'tiny.gin'\ninclude 'recipe/tinny.gin'\n")
    assert error.startswith(f"{tmp_path}/run.gin line 3: include 'recipe/tinny.gin' not found; ")
    assert f"then in the gin/ directory ({config.GIN_DIR})" in error
    assert error.endswith("Did you mean 'recipe/tiny.gin'?")


def test_an_include_cycle_is_named_instead_of_recursing_until_python_gives_up(tmp_path):
    (tmp_path / "b.gin").write_text(f"include '{tmp_path}/run.gin'\n")
    error = _load_error(tmp_path, f"include '{tmp_path}/b.gin'\n")
    assert f"include cycle ({tmp_path}/run.gin -> {tmp_path}/b.gin -> {tmp_path}/run.gin)" in error


def test_an_error_in_an_included_file_names_that_file_and_the_include(tmp_path):
    (tmp_path / "inner.gin").write_text("\ntrain.ModelConfig.d_modl = 64\n")
    error = _load_error(tmp_path, f"include 'tiny.gin'\ninclude '{tmp_path}/inner.gin'\n")
    assert error.startswith(f"{tmp_path}/inner.gin line 2: train.ModelConfig has no parameter 'd_modl'. "
                            "Did you mean d_model?")
    assert error.endswith(f"(`train.ModelConfig.d_modl = 64`); included from {tmp_path}/run.gin line 2")


def test_a_bracket_left_open_names_where_it_opened(tmp_path):
    error = _load_error(tmp_path, "include 'tiny.gin'\ntrain.Config.steps = 5\nevaluate.Config.prompts = [\n")
    assert error == f"{tmp_path}/run.gin line 3: '[' is never closed"


def test_an_override_error_names_that_override_not_the_next_one(tmp_path):
    with pytest.raises(config.ConfigError) as e:
        config.load([TINY], ["train.Config.steps = (1,", "train.Config.seed = 1"])
    assert str(e.value) == "override 'train.Config.steps = (1,': '(' is never closed"
    with pytest.raises(config.ConfigError) as e:
        config.load([TINY], ["train.Config.seed = 1", "train.Config.steps = 1e"])
    assert str(e.value).startswith("override 'train.Config.steps = 1e': ")


def test_includes_are_found_only_where_gin_reads_them():
    text = "# include 'x.gin'\ninclude 'a.gin'\nx.y = ['include', 'b.gin']\n\ninclude \"c.gin\"  # why\n"
    assert gin_errors.scan(text) == ([(2, "a.gin"), (5, "c.gin")], "")
