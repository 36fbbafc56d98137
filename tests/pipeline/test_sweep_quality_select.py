"""gin/sweeps/quality_select.gin (issue 38's ablation) from its config alone: the five selections it names, at
one token budget, sharing everything up to the score table, so the web pages are scored once, and one
reference model (trained once, whatever the seed) for the ranking by bits per byte.

    PYTHONPATH=$PWD .venv/bin/python -m pytest -q tests/pipeline/test_sweep_quality_select.py

Running it is benchmarks/RESULTS.md's "Selecting documents by a model (issue 38)" (about 14 minutes).
"""

import json

from pipeline import sweep
from stages.clean.config import KeepTop
from stages.download.sources import Embedded, Files
from tests.conftest import REPO

SWEEP = f"{REPO}/gin/sweeps/quality_select.gin"
VARIANTS = {"random-30%": KeepTop(score="random", keep_fraction=0.3),
            "quality-top30%": KeepTop(score="quality", keep_fraction=0.3),
            "bpb-top30%": KeepTop(score="bpb", keep_fraction=0.3),
            "quality-top10%": KeepTop(score="quality", keep_fraction=0.1),
            "all-kept": None}


def test_quality_select_scores_once_and_selects_per_variant_at_one_token_budget(tmp_path):
    pages = tmp_path / "pages.jsonl"       # the web text, by the macro the header tells users to set
    pages.write_text("".join(json.dumps({"id": f"p{i}", "text": f"page {i} " * 50,
                                         "metadata": {"url": f"example.com/{i}"}}) + "\n" for i in range(3)))
    params = [f'CC_SAMPLE = "{pages}"', f'pipeline.Settings.cache_root = "{tmp_path / "cache"}"']
    runs = sweep.runs([SWEEP], params)
    assert [(r.variant, r.seed) for r in runs] == [(v, s) for v in VARIANTS for s in (0, 1, 2)]
    keys: dict[str, set] = {}
    for r in runs:
        for node, planned in r.plan.stages.items():
            keys.setdefault(node, set()).add(planned.key)
    for node, count in [("download", 1), ("classifier", 1), ("score", 1), ("clean", 5), ("tokenizer", 5),
                        ("shard", 5), ("train", 15), ("evaluate", 15), ("perplexity", 1),
                        ("train[reference]", 1), ("score[reference]", 1)]:
        assert len(keys[node]) == count, (node, len(keys[node]))
    bpb = next(r.plan for r in runs if r.variant == "bpb-top30%")
    assert isinstance(bpb.stages["download[reference]"].config.source, Embedded)   # the docstrings' model
    assert {r.variant: r.plan.stages["clean"].config.keep_top for r in runs} == VARIANTS
    trains = [r.plan.stages["train"].config for r in runs]
    assert len({(t.steps, t.global_batch, t.seq_len, t.model) for t in trains}) == 1     # one token budget
    # DCLM's shape: explanatory English against the very web pages that are then scored and selected
    plan = runs[0].plan
    classifier = plan.stages["classifier"].config
    assert isinstance(classifier.positives, Embedded)
    assert classifier.negatives == Files(paths=(str(pages),), id_field="id", url_field="metadata.url")
    assert plan.stages["download"].config.source == classifier.negatives
