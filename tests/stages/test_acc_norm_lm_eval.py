"""Which acc_norm is which, on a hand case: `acc_norm` divides a choice's log-likelihood by its characters
with the leading space (OLMES' acc_per_char), `acc_norm_lm_eval` by its characters without it (lm-eval
0.4.13's acc_norm: `len(choice)` of the choice as doc_to_choice gives it). tests/export/test_lm_eval_hf.py
checks acc_norm_lm_eval against lm-eval's own per-document acc_norm on a real run.

    .venv/bin/python -m pytest -q -p no:cacheprovider tests/stages/test_acc_norm_lm_eval.py
"""

import numpy as np

from stages.yardstick_data.tasks import Item
from stages.yardsticks import task_metrics


def test_the_two_normalisations_credit_different_choices_on_a_hand_case():
    # " a" and " abc": 2 and 4 characters with the space, 1 and 3 without. Log-likelihoods -1.8 and -4.0:
    #   with the space:    -1.8 / 2 = -0.90  beats  -4.0 / 4 = -1.00   -> " a"   (choice 0)
    #   without it:        -1.8 / 1 = -1.80  loses to -4.0 / 3 = -1.33 -> " abc" (choice 1)
    items = [Item("t", "t-0", "Q:", (" a", " abc"), 1)]
    score = task_metrics.score_task(items, [np.array([-1.8, -4.0])], resamples=10)
    assert score["acc"]["value"] == 0.0               # -1.8 > -4.0: unnormalised, choice 0
    assert score["acc_norm"]["value"] == 0.0          # OLMES: choice 0
    assert score["acc_norm_lm_eval"]["value"] == 1.0  # lm-eval: choice 1, the gold


def test_a_choice_that_is_only_the_delimiter_does_not_divide_by_zero():
    items = [Item("t", "t-0", "Q:", (" ", " ab"), 0)]
    score = task_metrics.score_task(items, [np.array([-0.5, -3.0])], resamples=10)
    assert score["acc_norm_lm_eval"]["value"] == 1.0  # -0.5 / 1 against -3.0 / 2
