"""lm-eval tasks that cannot run are one `error:` line and exit status 2 before any stage runs, not a failure
after training and evaluation: an unknown task name (with the closest names), a task YAML that does not
parse (its file and line, not "unknown task"), a hub dataset that cannot be fetched, a missing include path.

    .venv/bin/python -m pytest -q -p no:cacheprovider tests/pipeline/test_bad_tasks.py

Each case runs `python -m pipeline run --gin gin/tiny.gin` with evaluate.Config.harness_tasks set, through
`assert_one_error_line_before_work` (tests/pipeline/test_bad_config.py). The cases that name a built-in task
index lm-eval's ~15k task YAMLs in the check (about 13 s each on 2 busy cores); local ones take about 2 s.
Needs the `harness` extra (lm-eval), which `make test` installs.
"""

from __future__ import annotations

import pytest

from tests.pipeline.test_bad_config import Case, _case, assert_one_error_line_before_work

pytest.importorskip("lm_eval")

# bytes: a case's text files are str.format-ed with its paths, and a task YAML has braces of its own
GOOD = (b'{"task": "refinery_ok", "dataset_path": "json", "output_type": "loglikelihood_rolling", '
        b'"doc_to_text": "", "doc_to_target": "{{text}}", "test_split": "test"}\n')
BROKEN = b"task: refinery_broken\ndataset_path: json\ndoc_to_text: [unclosed\noutput_type: multiple_choice\n"


def _tasks(*names: str) -> str:
    return "evaluate.Config.harness_tasks=(" + "".join(f'"{n}", ' for n in names) + ")"


INCLUDE = 'evaluate.Config.harness_include_path="{dir}/tasks"'

CASES = [
    _case("unknown_builtin_task", ["unknown lm-eval task(s) ['arc_eazy']", "'arc_easy'"], _tasks("arc_eazy")),
    _case("task_yaml_syntax_error",
          ["{dir}/tasks/broken.yaml line 4", "not valid YAML"],
          _tasks("refinery_broken"), INCLUDE,
          files=(("tasks/broken.yaml", BROKEN), ("tasks/ok.yaml", GOOD))),
    _case("task_yaml_includes_a_missing_file", ["{dir}/tasks/child.yaml", "No such file", "parent.yaml"],
          _tasks("refinery_child"), INCLUDE,
          files=(("tasks/child.yaml", "include: parent.yaml\ntask: refinery_child\n"),)),
    _case("missing_include_path", "evaluate.Config.harness_include_path='{dir}/nope' does not exist",
          _tasks("refinery_ok"), 'evaluate.Config.harness_include_path="{dir}/nope"'),
    _case("include_path_is_a_file", "is not a local directory",
          _tasks("refinery_ok"), 'evaluate.Config.harness_include_path="{dir}/tasks/ok.yaml"',
          files=(("tasks/ok.yaml", GOOD),)),
    _case("missing_task_yaml_path", "lm-eval task YAML '{dir}/nope.yaml' does not exist",
          _tasks("{dir}/nope.yaml")),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_a_task_that_cannot_run_is_one_error_line_before_any_stage(case: Case, tmp_path):
    assert_one_error_line_before_work(case, tmp_path)


def test_a_hub_task_offline_and_not_cached_is_one_error_line_before_any_stage(tmp_path, monkeypatch):
    """arc_easy reads allenai/ai2_arc from the hub: with HF_DATASETS_OFFLINE and an empty HF_HOME it cannot
    be had, and the run says so before training (it failed after evaluation: a 151-line ConnectionError)."""
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)    # other test modules set it for their process
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    assert_one_error_line_before_work(
        _case("hub_task_offline",
              ["lm-eval task 'arc_easy' reads the Hugging Face hub dataset 'allenai/ai2_arc'",
               "HF_DATASETS_OFFLINE is set"], _tasks("arc_easy")), tmp_path)


def test_tasks_that_can_run_pass_the_check(tmp_path):
    """The check is not a wall: a local task under a good include path, and a task YAML by its path."""
    from stages.evaluate import harness

    (tmp_path / "ok.yaml").write_bytes(GOOD)
    assert harness.check_tasks(["refinery_ok"], str(tmp_path)) == ""
    assert harness.check_tasks([str(tmp_path / "ok.yaml")]) == ""
