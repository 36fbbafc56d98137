"""The clean stage's mistakes that are one `error:` line and exit status 2 before any stage runs, nothing
written: the "nltk" word splitter without punkt's trained model, and a contamination check of other
yardsticks than those scored. The table and its assertion are tests/pipeline/test_bad_config.py's (`Case`,
`_case`, `assert_one_error_line_before_work`); this file holds its own cases so that no two tables are edited
at once.

    .venv/bin/python -m pytest -q -p no:cacheprovider tests/pipeline/test_bad_clean_checks.py
"""

from __future__ import annotations

import importlib.util

import pytest

from stages.clean import words
from tests.pipeline.test_bad_config import _case, assert_one_error_line_before_work

CASES = [
    # An untrained punkt (NLTK's fallback) splits at abbreviations: refused, saying how to get the model.
    _case("nltk_splitter_without_punkt",
          ["score: clean.GopherQuality.splitter='nltk': word splitter 'nltk' needs punkt's trained English "
           "model (tokenizers/punkt_tab/english)", words.PUNKT_DOWNLOAD],
          "clean.Config.gopher_quality = @clean.GopherQuality()", 'clean.GopherQuality.splitter = "nltk"'),
    # The check follows yardsticks.Config.tasks; a list of its own would report on what is not scored.
    _case("contamination_of_other_tasks_than_scored",
          ["evaluate: clean.Contamination.tasks=('hellaswag',) checks other yardsticks than "
           "yardsticks.Config.tasks=('hellaswag', 'arc_easy', 'arc_challenge', 'piqa') scores",
           "leave clean.Contamination.tasks unbound"],
          'clean.Contamination.tasks = ("hellaswag",)'),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_a_bad_clean_setting_is_one_error_line_before_any_stage(case, tmp_path):
    if case.name == "nltk_splitter_without_punkt" and (importlib.util.find_spec("nltk") is None
                                                       or words.punkt_model() is not None):
        pytest.skip("needs NLTK installed and punkt's trained model absent (no NLTK data download)")
    assert_one_error_line_before_work(case, tmp_path)
