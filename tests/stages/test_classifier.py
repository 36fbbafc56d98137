"""The classifier stage: a fastText classifier trained on a separable synthetic set separates held-out
documents (ROC AUC >= 0.95) and one trained on shuffled labels does not (|AUC - 0.5| < 0.1); training is
deterministic and a killed run reruns to the same bytes; contaminated positives are dropped; the errors
before and during work; the Scorer gives what fastText's predict gives; ROC AUC and the n-gram weights
against hand-computed and fastText-computed values.

    PYTHONPATH=$PWD .venv/bin/python -m pytest -q tests/stages/test_classifier.py
"""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import random
import re

import fasttext
import numpy as np
import pytest

from stages import classifier, yardsticks
from stages.classifier import metrics, ngrams, scoring
from stages.classifier.report import _code as report_code
from stages.clean.config import Contamination
from stages.download.sources import Files
from stages.io.refusal import Refusal
from stages.yardstick_data import reference
from tests.conftest import REPO

NO_YARDSTICKS = Contamination(reference_sets=(), tasks=())
FABLES = Contamination(reference_sets=("aesop_fables",), tasks=())
# Small hash tables keep each model a few MB (fastText's 2M rows x dim 100 would be 800 MB); lr 0.5 lets 5
# epochs over a few hundred documents learn more than the default 0.1 does (the ranking is right either way;
# 0.5 diverges on the shuffled labels: fastText stops with "Encountered NaN").
SMALL = {"bucket": 20_000, "dim": 20, "lr": 0.2}
POSITIVE_WORDS = [f"river{i}" for i in range(40)]
NEGATIVE_WORDS = [f"stone{i}" for i in range(40)]
SHARED_WORDS = [f"and{i}" for i in range(150)]


def _text(rng: random.Random, own: list[str], words: int = 50) -> str:
    """A document of `words` words: a fifth from the class's own vocabulary, the rest shared noise; lines of
    ten words, so training and scoring meet newlines."""
    chosen = [rng.choice(own if rng.random() < 0.2 else SHARED_WORDS) for _ in range(words)]
    return "\n".join(" ".join(chosen[i:i + 10]) for i in range(0, words, 10))


def _files(path, texts: list[str]) -> Files:
    """A jsonl source of `texts`, with ids of their own: a document's id (and so whether it is held out) does
    not depend on where pytest puts the file."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.writelines(json.dumps({"id": f"{os.path.basename(path)}-{i}", "text": t}) + "\n"
                     for i, t in enumerate(texts))
    return Files(paths=(str(path),), id_field="id")


@pytest.fixture(scope="module")
def separable(tmp_path_factory):
    """(config, out_dir) of a classifier trained on two sources with their own vocabularies."""
    root = tmp_path_factory.mktemp("separable")
    rng = random.Random(0)
    config = classifier.Config(
        positives=_files(root / "pos.jsonl", [_text(rng, POSITIVE_WORDS) for _ in range(300)]),
        negatives=_files(root / "neg.jsonl", [_text(rng, NEGATIVE_WORDS) for _ in range(300)]),
        holdout_fraction=0.3, contamination=NO_YARDSTICKS, **SMALL)
    assert classifier.check(config) == ""
    classifier.run(config, {}, str(root / "out"), str(root / "work"))
    return config, str(root / "out")


def _report(out_dir: str) -> dict:
    with open(os.path.join(out_dir, "report.json")) as f:
        return json.load(f)


def test_a_separable_set_is_separated_on_held_out_documents(separable):
    config, out = separable
    report = _report(out)
    held = report["holdout_metrics"]
    assert report["mode"] == "trained" and report["docs_read"] == {"positives": 300, "negatives": 300}
    assert sum(report["train"].values()) + held["docs"] == 600 and held["docs"] >= 150
    assert held["roc_auc"] >= 0.95 and held["precision"] > 0.7 and held["recall"] > 0.7
    # The heaviest words are mostly each class's own (shared words get weights by chance), never the other's
    top = report["ngrams"]
    for key, own, other in (("most_positive", "river", "stone"), ("most_negative", "stone", "river")):
        words = [row["ngram"] for row in top[key] if " " not in row["ngram"]]
        assert words[0].startswith(own) and sum(w.startswith(own) for w in words) >= 10, top[key]
        assert not any(w.startswith(other) for w in words), top[key]
    assert len(top["most_positive"]) == len(top["most_negative"]) == classifier.NGRAMS
    assert top["words"] == len(POSITIVE_WORDS + NEGATIVE_WORDS + SHARED_WORDS) and top["bigrams"] > 0
    with open(os.path.join(out, "report.md")) as f:
        text = f.read()
    assert "ROC AUC 1.000" in text or re.search(r"ROC AUC 0\.9[5-9]\d", text)
    assert report_code("a|b") == "`a\\|b`" and report_code("x`y") == "``x`y``"      # a table cell's code span
    assert report_code("`") == "`` ` ``"
    assert os.path.getsize(os.path.join(out, "roc.png")) > 1000
    assert classifier.summary(_Committed(out)).startswith(f"trained on {report['train']['positives']:,} + ")


def test_shuffled_labels_stay_near_chance(tmp_path):
    """Both classes drawn from one mixture: nothing to learn, and on ~480 held-out documents the AUC's
    standard error is ~0.026, so |AUC - 0.5| < 0.1 is a four-sigma bound, not luck (the seed is fixed)."""
    rng = random.Random(1)

    def mixed():
        return [_text(rng, POSITIVE_WORDS if rng.random() < 0.5 else NEGATIVE_WORDS) for _ in range(600)]

    config = classifier.Config(positives=_files(tmp_path / "a.jsonl", mixed()),
                               negatives=_files(tmp_path / "b.jsonl", mixed()),
                               holdout_fraction=0.4, contamination=NO_YARDSTICKS, **SMALL)
    classifier.run(config, {}, str(tmp_path / "out"), str(tmp_path / "work"))
    held = _report(str(tmp_path / "out"))["holdout_metrics"]
    assert held["docs"] >= 400
    assert abs(held["roc_auc"] - 0.5) < 0.1, held


def test_training_is_deterministic_and_a_killed_run_reruns_to_the_same_bytes(separable, tmp_path,
                                                                             monkeypatch):
    config, first = separable
    classifier.run(config, {}, str(tmp_path / "again"), str(tmp_path / "work"))
    for name in ("model.bin", "report.json", "report.md", "roc.png"):
        assert _bytes(tmp_path / "again" / name) == _bytes(os.path.join(first, name)), name

    def killed(*args, **kwargs):
        raise RuntimeError("killed mid-run")

    with monkeypatch.context() as m:                     # after model.bin, before the report
        m.setattr(ngrams, "top", killed)
        with pytest.raises(RuntimeError, match="killed"):
            classifier.run(config, {}, str(tmp_path / "killed"), str(tmp_path / "work"))
    assert os.listdir(tmp_path / "killed") == ["model.bin"]          # report.json, written last, is absent
    classifier.run(config, {}, str(tmp_path / "rerun"), str(tmp_path / "work"))
    assert sorted(os.listdir(tmp_path / "rerun")) == sorted(os.listdir(first))
    for name in os.listdir(first):
        assert _bytes(tmp_path / "rerun" / name) == _bytes(os.path.join(first, name)), name


def _bytes(path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


class _Committed:
    """What `summary` and `scorer` read of a committed output: its path and files."""

    def __init__(self, path: str):
        self.path = path

    def file(self, name: str) -> str:
        return os.path.join(self.path, name)


def test_the_scorer_gives_fastTexts_own_predictions_and_pickles_without_the_model(separable):
    config, out = separable
    scorer = classifier.scorer(_Committed(out))
    assert scorer == classifier.load_scorer(out, "hq") == scoring.Scorer(os.path.join(out, "model.bin"), "hq")
    rng = random.Random(5)
    texts = [_text(rng, POSITIVE_WORDS), _text(rng, NEGATIVE_WORDS), "", "one line", "a\r\nb\u2028c",
             "river1 __label__cc stone2\n\n", "ünïcödé river3 ✓"]
    model = fasttext.load_model(os.path.join(out, "model.bin"))
    expected = [dict(zip(*model.predict(scoring.to_line(t), k=-1)))["__label__hq"] for t in texts]
    scores = scorer.score_many(texts)
    assert scores.dtype == np.float64 and scores.tolist() == expected
    assert scores[0] > 0.5 > scores[1]
    # A fastText build without multi-line predict (fasttext-predict's) is asked one text at a time: the same
    one_at_a_time = _WithoutMultiline(model)
    assert scoring.probabilities(one_at_a_time, texts, "hq").tolist() == expected and one_at_a_time.calls == 7
    state = pickle.dumps(scorer)
    assert len(state) < 500 and pickle.loads(state).score_many(texts).tolist() == expected
    assert classifier.load_scorer(os.path.join(out, "model.bin"), "hq") == scorer
    with pytest.raises(ValueError, match=r"has no label 'good'; its labels are \['(hq|cc)', '(hq|cc)'\]"):
        classifier.load_scorer(out, "good").score_many(["x"])


class _WithoutMultiline:
    """A fastText model as a predict-only build would bind it: `predict` one line at a time, counted."""

    def __init__(self, model):
        self.labels, self.f, self._model, self.calls = model.labels, object(), model, 0

    def predict(self, line, k=1):
        assert isinstance(line, str)
        self.calls += 1
        return self._model.predict(line, k=k)


def test_to_line_joins_lines_as_dclm_does_and_drops_words_fasttext_would_read_as_labels(separable):
    assert scoring.to_line("  a\nb\r\nc\rd\u2028e\x85f\n\n") == "a b c d e f"
    assert scoring.to_line("a\n\nb") == "a  b"                   # DCLM's join: an empty line is an empty word
    assert scoring.to_line("x __label__hq y\t__label__z\n__label__") == "x  y\t "
    assert scoring.to_line("a__label__b c") == "a__label__b c"   # only a word that starts with the prefix
    model = fasttext.load_model(os.path.join(separable[1], "model.bin"))
    for text in ("river1 __label__cc stone2", "__label__hq river1 river2"):     # predict skips them too
        assert model.predict(text, k=-1)[1].tolist() == model.predict(scoring.to_line(text), k=-1)[1].tolist()


def test_ngram_weights_rebuild_fastTexts_probabilities(separable):
    """The bigram rows (fastText's hash, reimplemented) and the weights are right: the mean of a line's
    feature weights is its log-odds, which gives back the probability fastText predicts."""
    model = fasttext.load_model(os.path.join(separable[1], "model.bin"))
    inputs = np.asarray(model.get_input_matrix(), np.float64)
    direction = ngrams._direction(model, "__label__hq")
    args = model.f.getArgs()
    for line in ("river1 and7 stone3 river1", "ünïcödé wörds and1 and2 ✓", "unseen river2"):
        words = line.split() + [ngrams.EOS]
        rows = [model.get_word_id(w) for w in words if model.get_word_id(w) >= 0]
        rows += ngrams.bigram_rows(list(zip(words, words[1:])), len(model.words), args.bucket).tolist()
        log_odds = (inputs[rows] @ direction).mean()
        labels, probs = model.predict(line, k=-1)
        hq = dict(zip(labels, probs))["__label__hq"] - 1e-5        # fastText adds 1e-5 to each probability
        assert 1 / (1 + np.exp(-log_odds)) == pytest.approx(hq, abs=1e-5), line
    assert ngrams.word_hash("") == 2166136261 and ngrams.word_hash("a") == 0xE40C292C    # FNV-1a's


def test_roc_auc_is_rank_based_with_ties_averaged():
    # Pairs (positive, negative): 0.9 beats 0.8 and 0.3; 0.8 ties 0.8 (a half) and beats 0.3; 0.1 beats none
    assert metrics.roc_auc([1, 0, 1, 0, 1], [0.9, 0.8, 0.8, 0.3, 0.1]) == pytest.approx(3.5 / 6)
    assert metrics.roc_auc([0, 1], [0.2, 0.7]) == 1.0 and metrics.roc_auc([1, 0], [0.2, 0.7]) == 0.0
    assert metrics.roc_auc([1, 0, 1, 0], [0.5] * 4) == 0.5
    assert metrics.roc_auc([1, 1], [0.1, 0.2]) is None and metrics.roc_auc([], []) is None
    rng = np.random.default_rng(0)
    labels, scores = rng.integers(0, 2, 300), rng.integers(0, 20, 300) / 20      # many ties
    pos, neg = scores[labels == 1], scores[labels == 0]
    pairs = ((pos[:, None] > neg[None, :]) + 0.5 * (pos[:, None] == neg[None, :])).mean()
    assert metrics.roc_auc(labels, scores) == pytest.approx(pairs)
    fpr, tpr = metrics.roc_curve([1, 0, 1, 0, 1], [0.9, 0.8, 0.8, 0.3, 0.1])
    assert fpr.tolist() == [0, 0, 0.5, 1, 1] and tpr.tolist() == [0, 1 / 3, 2 / 3, 2 / 3, 1]
    assert np.trapezoid(tpr, fpr) == pytest.approx(3.5 / 6)                   # the curve's area is the AUC
    assert metrics.precision_recall([1, 0, 1, 1], [0.9, 0.6, 0.2, 0.5]) == (2 / 3, 2 / 3)
    assert metrics.precision_recall([1, 0], [0.1, 0.2]) == (None, 0.0)


def test_contaminated_positives_are_dropped_and_counted(tmp_path):
    """A positive that holds a fable of the reference set (a yardstick) is dropped before training."""
    fable_id, fable = reference.embedded_documents()[3]
    rng = random.Random(2)
    positives = [_text(rng, POSITIVE_WORDS) for _ in range(40)]
    for i in (3, 17, 30):
        positives[i] = positives[i] + "\n" + fable
    config = classifier.Config(positives=_files(tmp_path / "pos.jsonl", positives),
                               negatives=_files(tmp_path / "neg.jsonl",
                                                [_text(rng, NEGATIVE_WORDS) for _ in range(40)]),
                               contamination=FABLES, **SMALL)
    classifier.run(config, {}, str(tmp_path / "out"), str(tmp_path / "work"))
    report = _report(str(tmp_path / "out"))
    assert report["docs_read"]["positives"] == 40
    assert report["contamination"]["positives_dropped"] == 3
    assert report["train"]["positives"] + report["holdout"]["positives"] == 37
    entry = report["contamination"]["yardsticks"]["aesop_fables"]
    assert entry["docs_contaminated"] == 3 and [e["item"] for e in entry["examples"]] == [fable_id]
    assert "3 contaminated positives dropped" in classifier.summary(_Committed(str(tmp_path / "out")))
    all_fables = classifier.Config(positives=_files(tmp_path / "fables.jsonl", [fable] * 3),
                                   negatives=config.negatives, contamination=FABLES, **SMALL)
    with pytest.raises(Refusal, match="every one of the 3 positives .* shares text with a yardstick "
                                      r"\(aesop_fables\); nothing is left to train on"):
        classifier.run(all_fables, {}, str(tmp_path / "none"), str(tmp_path / "work"))


def test_the_check_follows_what_is_scored():
    scored = yardsticks.Config(reference_sets=("aesop_fables",), tasks=("piqa",))
    followed = classifier.follow(classifier.Config(), {"yardsticks": scored})
    checked = followed.contamination
    assert (checked.reference_sets, checked.tasks) == (("aesop_fables",), ("piqa",))
    own = classifier.Config(contamination=NO_YARDSTICKS)
    assert classifier.follow(own, {"yardsticks": scored}).contamination == NO_YARDSTICKS


def test_errors_in_the_config_name_the_field(tmp_path):
    files = _files(tmp_path / "a.jsonl", ["some text"])
    other = _files(tmp_path / "b.jsonl", ["other text"])
    with pytest.raises(ValueError, match="give both classes"):
        classifier.Config(positives=files)
    with pytest.raises(ValueError, match="are the same source config .* must come from different sources"):
        classifier.Config(positives=files, negatives=Files(paths=(str(tmp_path / "a.jsonl"),), id_field="id"))
    with pytest.raises(ValueError, match=r"classifier.Config.max_docs=1 must be >= 2"):
        classifier.Config(positives=files, negatives=other, max_docs=1)
    with pytest.raises(ValueError, match="positive_label and negative_label are both 'hq'"):
        classifier.Config(negative_label="hq")
    with pytest.raises(ValueError, match="is not a download source"):
        classifier.Config(positives="a.jsonl", negatives=other)
    with pytest.raises(ValueError, match="word_ngrams=2 needs hash rows"):
        classifier.Config(bucket=0)
    with pytest.raises(ValueError, match=r"holdout_fraction=1.0 is not in \[0, 1\)"):
        classifier.Config(holdout_fraction=1.0)


def test_errors_before_work_are_one_line(separable, tmp_path, monkeypatch):
    files = _files(tmp_path / "a.jsonl", ["some text"])
    blank = tmp_path / "blank.jsonl"
    blank.write_text("\n\n")
    empty_class = classifier.Config(positives=files, negatives=Files(paths=(str(blank),)))
    assert re.fullmatch(r"classifier.Config.negatives: download.Files\(paths=\('.*blank.jsonl',\).*\) gives "
                        "0 documents: the files it matches hold no record; point it at files with documents",
                        classifier.check(empty_class))
    missing = classifier.Config(pretrained=str(tmp_path / "nope.bin"))
    assert classifier.check(missing) == (f"classifier.Config.pretrained='{tmp_path}/nope.bin' does not "
                                         f"exist; {classifier.NAME_ONE}")
    with pytest.raises(FileNotFoundError, match="classifier.Config.pretrained=.* does not exist"):
        classifier.key_inputs(missing)
    model = os.path.join(separable[1], "model.bin")
    assert classifier.check(classifier.Config(pretrained=model)) == ""
    labels = scoring.plain_labels(fasttext.load_model(model).labels)
    assert sorted(labels) == ["cc", "hq"]
    assert classifier.check(classifier.Config(pretrained=model, positive_label="good")) == (
        f"classifier.Config.positive_label='good' is not a label of {model}; its labels are {labels}: set "
        "classifier.Config.positive_label to the one whose probability is the score")
    assert classifier.check(classifier.Config(pretrained=str(blank))).startswith(
        f"classifier.Config.pretrained='{blank}': {blank} is not a fastText model file")
    trainable = classifier.Config(positives=files, negatives=separable[0].negatives,
                                  contamination=NO_YARDSTICKS)
    assert classifier.check(trainable) == ""
    monkeypatch.delattr(fasttext, "train_supervised")                   # what fasttext-predict's module is
    problem = classifier.check(trainable)
    assert "\n" not in problem and problem.endswith(
        "install the full build: .venv/bin/python -m pip install --no-deps --force-reinstall "
        "fasttext-numpy2==0.10.4 (make install does)")
    assert classifier.check(classifier.Config(pretrained=model)) == ""      # scoring needs no trainer


def test_the_makefile_installs_the_trainer_the_check_names():
    with open(os.path.join(REPO, "Makefile")) as f:
        makefile = f.read()
    install = re.search(r"^\t\$\(PY\) -m pip install .*--no-deps --force-reinstall (\S+)$", makefile, re.M)
    assert install and install.group(1) == classifier.FASTTEXT_TRAINER
    assert classifier.INSTALL_TRAINER.endswith(f"--no-deps --force-reinstall {classifier.FASTTEXT_TRAINER}")


def test_a_class_that_gives_no_documents_is_refused(tmp_path):
    config = classifier.Config(positives=_files(tmp_path / "empty.jsonl", ["", "  \n "]),
                               negatives=_files(tmp_path / "neg.jsonl", ["a negative"] * 3),
                               contamination=NO_YARDSTICKS)
    with pytest.raises(Refusal, match=r"classifier: positives: download.Files\(paths=\('.*empty.jsonl',\)"
                                      r".*\) gave 0 documents \(1 units read, 2 records without text\)"):
        classifier.run(config, {}, str(tmp_path / "out"), str(tmp_path / "work"))


def test_a_diverging_training_is_refused_naming_the_learning_rate(separable, tmp_path):
    config = dataclasses.replace(separable[0], lr=1000.0)
    with pytest.raises(Refusal, match=r"fastText could not train on \{'positives': \d+, 'negatives': \d+\} "
                                      r"documents with .*: RuntimeError: Encountered NaN.; training "
                                      r"diverged: lower classifier.Config.lr=1000.0"):
        classifier.run(config, {}, str(tmp_path / "out"), str(tmp_path / "work"))


def test_max_docs_takes_the_first_documents(tmp_path):
    config = classifier.Config(positives=_files(tmp_path / "pos.jsonl", [f"p{i} x" for i in range(10)]),
                               negatives=_files(tmp_path / "neg.jsonl", [f"n{i} y" for i in range(10)]),
                               max_docs=4)
    first = [text for _, text in classifier.read_class(config, "positives")]
    assert first == ["p0 x", "p1 x", "p2 x", "p3 x"]


def test_a_pretrained_file_is_copied_keyed_and_evaluated(separable, tmp_path):
    config, out = separable
    model = os.path.join(out, "model.bin")
    pretrained = classifier.Config(pretrained=model, positives=config.positives, negatives=config.negatives)
    keyed = classifier.key_inputs(pretrained)
    assert set(keyed) == {"positives", "negatives", "pretrained"}
    assert list(keyed["pretrained"]) == [model] and keyed["pretrained"][model].startswith("size=")
    classifier.run(pretrained, {}, str(tmp_path / "out"), str(tmp_path / "work"))
    assert _bytes(tmp_path / "out" / "model.bin") == _bytes(model)
    report = _report(str(tmp_path / "out"))
    assert report["mode"] == "pretrained" and report["holdout_metrics"]["docs"] == 600
    assert report["holdout_metrics"]["roc_auc"] >= 0.95            # most of these documents it was trained on
    assert sorted(report["model"]["labels"]) == ["__label__cc", "__label__hq"]
    line = classifier.summary(_Committed(str(tmp_path / "out")))
    assert line.startswith("pretrained model.bin; held out 600")
    alone = classifier.Config(pretrained=model)
    classifier.run(alone, {}, str(tmp_path / "alone"), str(tmp_path / "work"))
    assert _report(str(tmp_path / "alone"))["holdout_metrics"] is None
    assert scoring.model_header(model)["labels"] == list(fasttext.load_model(model).labels)
    assert scoring.model_header(model)["bucket"] == SMALL["bucket"]


def test_off_writes_a_report_and_no_scorer(tmp_path):
    config = classifier.Config()
    assert config.off and classifier.key_inputs(config) is None and classifier.check(config) == ""
    classifier.run(config, {}, str(tmp_path / "out"), str(tmp_path / "work"))
    assert sorted(os.listdir(tmp_path / "out")) == ["report.json", "report.md"]
    assert classifier.scorer(_Committed(str(tmp_path / "out"))) is None
    assert classifier.summary(_Committed(str(tmp_path / "out"))).startswith("off")
