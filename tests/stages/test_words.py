"""The word splitters by name (stages/clean/words.py `splitter`): each splits as its reference does.

    .venv/bin/python -m pytest -q tests/stages/test_words.py

spaCy and NLTK come with the `spacy`/`nltk` extras (and `bench`); their tests skip without them.
"""

import pickle
import sys

import pytest

from stages.clean import words

TEXT = ('Don\'t stop, Mr. Smith. It costs $3,000 -- e.g. "now", or (maybe) later... '
        "See example.com/page and well-known ideas; it's 12:30. Yes!\nA second line?")


def test_unknown_name_names_the_choices():
    with pytest.raises(ValueError, match=r"'spaCy'.*fast, spacy, nltk"):
        words.splitter("spaCy")


@pytest.mark.parametrize("name", words.SPLITTERS)
def test_pickles_and_splits_the_same_after(name):
    if name != "fast":
        pytest.importorskip(name)
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


def test_nltk_is_word_tokenize_with_the_punkt_it_has():
    nltk = pytest.importorskip("nltk")
    from nltk.tokenize import NLTKWordTokenizer
    from nltk.tokenize.punkt import PunktSentenceTokenizer

    split = words.splitter("nltk")
    got = split(TEXT)
    if split.model == "punkt_tab":
        assert list(got) == nltk.word_tokenize(TEXT)
    else:
        assert split.model == "untrained"
        punkt = PunktSentenceTokenizer()
        assert list(got) == [w for s in punkt.tokenize(TEXT) for w in NLTKWordTokenizer().tokenize(s)]
    assert "``" in got and "''" in got and "n't" in got


def test_missing_library_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "spacy", None)        # `import spacy` raises ImportError
    split = words.splitter("spacy")
    with pytest.raises(ImportError, match=r"'spacy' needs spacy.*pip install -e '\.\[spacy\]'"):
        split("text")
