"""The word splitters by name (stages/clean/words.py `splitter`): each splits as its reference does.

    .venv/bin/python -m pytest -q tests/stages/test_words.py

spaCy and NLTK come with the `spacy`/`nltk` extras (and `bench`); their tests skip without them. NLTK's
tests run with a punkt model of their own (`punkt_model`: a few abbreviations in punkt_tab's file format
under a temporary NLTK_DATA), since punkt's real trained model is a download the tests cannot make.
"""

import pickle
import sys

import pytest

from stages import clean
from stages.clean import gopher, spacy_rules, words

TEXT = ('Don\'t stop, Mr. Smith. It costs $3,000 -- e.g. "now", or (maybe) later... '
        "See example.com/page and well-known ideas; it's 12:30. Yes!\nA second line?")


def test_unknown_name_names_the_choices():
    with pytest.raises(ValueError, match=r"'spaCy'.*fast, spacy, nltk"):
        words.splitter("spaCy")


@pytest.fixture
def punkt_model(tmp_path, monkeypatch):
    """A punkt English model in punkt_tab's files (abbreviations only) as the one NLTK and the key find."""
    nltk = pytest.importorskip("nltk")

    model = tmp_path / "nltk_data" / words.PUNKT
    model.mkdir(parents=True)
    for name, text in (("collocations.tab", ""), ("sent_starters.txt", ""), ("ortho_context.tab", ""),
                       ("abbrev_types.txt", "dr\nmr\nu.s\nph.d\ne.g\n")):
        (model / name).write_text(text)
    monkeypatch.setenv("NLTK_DATA", str(tmp_path / "nltk_data"))
    monkeypatch.setattr(words, "nltk_data_path", lambda: [str(tmp_path / "nltk_data")])
    monkeypatch.setattr(nltk.data, "path", [str(tmp_path / "nltk_data")])
    nltk.tokenize._get_punkt_tokenizer.cache_clear()
    yield model
    nltk.tokenize._get_punkt_tokenizer.cache_clear()


@pytest.fixture
def no_punkt_model(tmp_path, monkeypatch):
    """No punkt model anywhere NLTK (or the key) looks, as on a machine without NLTK's data download."""
    nltk = pytest.importorskip("nltk")
    monkeypatch.setattr(words, "nltk_data_path", lambda: [str(tmp_path / "empty")])
    monkeypatch.setattr(nltk.data, "path", [str(tmp_path / "empty")])


@pytest.mark.parametrize("name", words.SPLITTERS)
def test_pickles_and_splits_the_same_after(name, request):
    if name in words.LIBRARY:
        pytest.importorskip(words.LIBRARY[name])
    if name == "nltk":
        request.getfixturevalue("punkt_model")
    split = words.splitter(name)
    first = split(TEXT)
    again = pickle.loads(pickle.dumps(split))
    assert again == split and again(TEXT) == first
    assert all(w and w == w.strip() for w in first)
    assert split.sentences("It works. Does it? Yes!") == 3


def test_fast_is_words():
    split = words.splitter("fast")
    assert split(TEXT) == words.words(TEXT) and split.sentences(TEXT) == words.sentences(TEXT)


def test_spacy_is_datatrove_0_10_english():
    pytest.importorskip("spacy")
    word_tokenizers = pytest.importorskip("datatrove.utils.word_tokenizers")
    theirs = word_tokenizers.SpaCyTokenizer("en")
    split = words.splitter("spacy")
    assert list(split(TEXT)) == theirs.word_tokenize(TEXT)
    assert '"' in split(TEXT) and "``" not in split(TEXT)      # spaCy keeps the quote as it is
    for line in TEXT.splitlines():
        assert split.sentences(line) == len(theirs.span_tokenize(line))


def test_nltk_is_word_tokenize_with_the_trained_punkt(punkt_model):
    import nltk

    split = words.splitter("nltk")
    got = split(TEXT)
    assert list(got) == nltk.word_tokenize(TEXT)
    assert "``" in got and "''" in got and "n't" in got
    assert "Mr." in got and split.sentences("Dr. Smith came. He left.") == 2       # the model's abbreviations


def test_nltk_without_the_trained_punkt_refuses_before_work_in_one_line(no_punkt_model):
    """NLTK's fallback, an untrained punkt, would split at `Dr.`: the splitter refuses it, the clean stage's
    check says so before any stage runs, and the key of a run that names the splitter says which model."""
    line = words.problem("nltk")
    assert "\n" not in line and line.startswith("word splitter 'nltk' needs punkt's trained English model "
                                               "(tokenizers/punkt_tab/english)")
    assert words.PUNKT_DOWNLOAD in line and words.problem("fast") == words.problem("spacy") == ""
    with pytest.raises(words.MissingPunkt, match="python -m nltk.downloader punkt_tab"):
        words.splitter("nltk")("Dr. Smith came.")
    config = clean.Config(gopher_quality=gopher.GopherQuality(splitter="nltk"))
    assert clean.check(config) == f"clean.GopherQuality.splitter='nltk': {line}"
    assert clean.check(clean.Config(gopher_quality=gopher.GopherQuality())) == ""


def test_the_clean_key_covers_the_splitter_library_and_punkt_model(punkt_model, monkeypatch):
    from importlib import metadata

    from pipeline import cache

    def key(config):
        return cache.stage_key("clean", clean.VERSION, config, {"download": "d"}, clean.key_inputs(config))

    fast = clean.Config(gopher_quality=gopher.GopherQuality(splitter="fast"))
    nltk_config = clean.Config(gopher_quality=gopher.GopherQuality(splitter="nltk"))
    assert clean.key_inputs(fast) is None      # "fast": keys as before splitters were keyed
    default = clean.key_inputs(clean.Config(gopher_quality=gopher.GopherQuality()))["splitters"]
    assert default == {"spacy_rules": {"spacy_rules": spacy_rules.VERSION}}     # the rules' own version
    found = clean.key_inputs(nltk_config)["splitters"]["nltk"]
    assert found == {"nltk": metadata.version("nltk"), "punkt_tab": words.fingerprint("nltk")["punkt_tab"]}
    before = key(nltk_config)
    (punkt_model / "abbrev_types.txt").write_text("dr\n")      # another model: another key
    assert key(nltk_config) != before
    real = metadata.version
    monkeypatch.setattr(metadata, "version", lambda name: "0.0" if name == "nltk" else real(name))
    assert clean.key_inputs(nltk_config)["splitters"]["nltk"]["nltk"] == "0.0"
    assert words.fingerprint("fast") is None


def test_missing_library_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "spacy", None)        # `import spacy` raises ImportError
    split = words.splitter("spacy")
    with pytest.raises(ImportError, match=r"'spacy' needs spacy.*pip install -e '\.\[spacy\]'"):
        split("text")
