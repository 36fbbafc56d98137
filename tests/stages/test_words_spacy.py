"""The "spacy_rules" word splitter (stages/clean/spacy_rules.py): spaCy's English tokenizer and sentencizer
as datatrove 0.10.1 runs them, written out as rules, without spaCy.

    .venv/bin/python -m pytest -q tests/stages/test_words_spacy.py

The hand-written cases pin what spaCy 3.8 gives (each expected list is spaCy's output) and run everywhere;
the tests marked by `pytest.importorskip("spacy")` compare with spaCy itself (its tables, and its tokens on
real pages and on generated strings), and skip where spaCy is not installed (`make test`).
"""

import gzip
import json
import os
import pickle
import random
import re
import sys

import pytest

from stages import clean
from stages.clean import gopher, ngrams, spacy_rules, words

# (text, spaCy's tokens joined by single spaces)
CASES = [
    ("Don't stop, Mr. Smith. It's 5pm and we can't wait!",
     "Do n't stop , Mr. Smith . It 's 5 pm and we ca n't wait !"),
    ("I’m sure they’ll say y'all cannot, gonna gotta.",
     "I ’m sure they ’ll say y' all can not , gon na got ta ."),
    ('Plant-based food, well-known e-mail; 1-2 and 10-20km.',
     'Plant - based food , well - known e - mail ; 1 - 2 and 10 - 20 km .'),
    ('See http://example.com/a?b=c, www.example.org and example.com/page.',
     'See http://example.com/a?b=c , www.example.org and example.com/page .'),
    ('Prices: $5, US$10, 3.5%, 1,000.50 and 10km/h or 5kg.',
     'Prices : $ 5 , US$ 10 , 3.5 % , 1,000.50 and 10 km/h or 5 kg .'),
    ('The U.S. and Ph.D. e.g. i.e. Jan. 5 at 5 p.m. in Calif.',
     'The U.S. and Ph.D. e.g. i.e. Jan. 5 at 5 p.m. in Calif.'),
    ('Wait... what?! Hello....World (really).',
     'Wait ... what ? ! Hello .... World ( really ) .'),
    ("''Galactica'' (TOS)|Galactica]] and Русский[править",
     "'' Galactica '' ( TOS)|Galactica ] ] and Русский[править"),
    ('Nice :) and sad :( and word:) and (see below): done <3',
     'Nice :) and sad :( and word :) and ( see below ): done <3'),
    ('中文。句子 and emoji 😀 glued😀 and #hashtag @user',
     '中文。句子 and emoji 😀 glued 😀 and # hashtag @user'),
    ('F(x) = \\frac{a}{b}; path/to/file.txt C:\\dir',
     'F(x ) = \\frac{a}{b } ; path / to / file.txt C:\\dir'),
    ('It was 70°F. Then 20°C. Then more.',
     'It was 70 ° F . Then 20 ° C . Then more .'),
    ("Rock'n'roll O'Brien's dog's bone; doin' somethin'",
     "Rock'n'roll O'Brien 's dog 's bone ; doin' somethin'"),
    ('[ :) ( : ) 8) a.m. 10a.m. 12:30 9/11/2001',
     '[ :) ( : ) 8) a.m. 10 a.m. 12:30 9/11/2001'),
    ("«Bonjour» „Hallo“ “quoted” ‘single’ 'plain'",
     "« Bonjour » „ Hallo “ “ quoted ” ‘ single ’ ' plain '"),
    ('  spaces\t\tand\nlines  \xa0 vanish  ',
     'spaces and lines vanish'),
]
SENTENCES = [("It works. Does it? Yes!", 3), ("One... two... three.", 1),
             ("Dr. Smith went home. He slept.", 2), ("Hi!! How are you?!", 2), ("end.  . Word", 3),
             ("A sentence 。another", 2), ("no end", 1), ("“Quoted.” Next one.", 2),
             ("e.g. this. And U.S. that.", 2), ("", 1)]
PYPI_PAGES = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "data", "pypi_pages.jsonl.gz")


@pytest.mark.parametrize(("text", "expected"), CASES)
def test_tokens_are_spacys(text, expected):
    spacy_rules.cache_clear()
    assert spacy_rules.words(text) == tuple(expected.split(" "))
    assert spacy_rules.words(text) == tuple(expected.split(" "))      # again, from the cache


@pytest.mark.parametrize(("line", "expected"), SENTENCES)
def test_sentences_are_the_sentencizers(line, expected):
    assert spacy_rules.sentences(line) == expected


def test_a_special_case_across_chunks_stops_a_join_in_one():
    """spaCy finds `[ :` (an emoticon's tokens across a space) and, though it never joins across chunks,
    that match keeps `:)` in the next chunk from being joined: the whole text decides, not each chunk."""
    spacy_rules.cache_clear()
    assert spacy_rules.words("x :)´pm") == ("x", ":)", "´", "pm")
    assert spacy_rules.words("[ :)´pm") == ("[", ":", ")", "´", "pm")
    assert spacy_rules.words("can:){?: ):‘z’a") == ("can", ":)", "{", "?", ":", ")", ":", "‘", "z’a")


def test_step_5_around_a_chunk_is_step_5_over_the_whole_text():
    """`words` runs step 5 across chunks only in a window around each chunk it can change (`_in_context`);
    on texts made of step 5's special cases, their pieces and varied whitespace, the tokens are those of
    step 5 over the whole text (`_doc_tokens`, stripped), cold and from the cache."""
    long_runs = [" ".join(run) for run in spacy_rules._joined_specials() if len(run) > 6]   # a chunk a token
    pieces = ["url):", "f(x):", "(:", ":)", "):", "(", ")", ":", "x", "It's", "'s", "e.g.", ":-)", ";)",
              ">:(", "<3", "o_O", "a.", "'ll", "'ve", "don't", "ca", "n't", "1", "pm", "(psycopg):", "b'',",
              "''", "'", *long_runs]
    gaps = ["", " ", " ", "  ", "\n", " \n "]
    rng = random.Random(4)
    windows = 0
    for cold in (True, False):
        if cold:
            spacy_rules.cache_clear()
        for _ in range(1500):
            text = "".join(rng.choice(pieces) * rng.randint(1, 2) + rng.choice(gaps)
                           for _ in range(rng.randint(1, 20)))
            chunks = text.split()
            for chunk in chunks:
                spacy_rules.tokens(chunk)
            windows += len(spacy_rules._reached(chunks))
            whole = tuple(t for t in spacy_rules._doc_tokens(text) if not t.isspace())
            assert spacy_rules.words(text) == whole, text
    assert windows > 1000        # the texts do reach step 5 across chunks


@pytest.mark.parametrize("stretch", [spacy_rules._STRETCH, 1])    # 1: stretches cut pieces, and grow
def test_step_5_in_a_stretch_of_a_long_text_is_step_5_over_the_whole_text(monkeypatch, stretch):
    """`_around` gives `_in_context` the pieces of a stretch of the text around the chunk, found as the
    (n+1)-th whole occurrence of its string: on long texts (the chunk's string also inside other chunks,
    several times whole, long chunks that the stretch cuts or must grow past) the tokens are those of step 5
    over the whole text."""
    monkeypatch.setattr(spacy_rules, "_STRETCH", stretch)
    long_runs = [" ".join(run) for run in spacy_rules._joined_specials() if len(run) > 6]
    pieces = ["url):", "f(x):", "(:", ":)", "):", "(", ")", ":", "x", "e.g.", ":-)", "o_O", "'s", "b'',",
              "''", "url):url):", "(:x", *long_runs]
    gaps = [" ", " ", "  ", "\n", " \n "]
    rng = random.Random(11)
    reach = 2 * (spacy_rules._longest_special() - 1)         # pieces `_in_context` reads on either side
    cut = 0
    for _ in range(300):
        text = "".join((rng.choice(pieces) if rng.random() < 0.8 else "y" * rng.randint(1, 400))
                       + rng.choice(gaps) for _ in range(rng.randint(30, 300)))
        chunks = text.split()
        every = spacy_rules._PIECES.findall(text)
        first = 1 if every[0][0].isspace() else 0
        for k in spacy_rules._reached(chunks):
            stretch, p, stretch_first = spacy_rules._around(text, chunks, k)
            whole_p = first + 2 * k
            lo = max(whole_p - reach, first)            # what `_in_context` reads, in stretch and text
            assert stretch[max(p - reach, stretch_first):p + reach + 1] == every[lo:whole_p + reach + 1], text
            cut += len(stretch) < len(every)
        whole = tuple(t for t in spacy_rules._doc_tokens(text) if not t.isspace())
        assert spacy_rules.words(text) == whole, text
    assert cut > 500        # stretches shorter than the text were used


def test_step_5_over_a_text_of_unseen_chunks_uses_their_tokens_before_it():
    """`_doc_tokens` (sentences' path for lines with other whitespace) on chunks it has not seen: the match
    `[ :` across chunks still keeps `:)` from being joined, as when the chunks are known (and in spaCy)."""
    text = "a  [ :)´pm"
    spacy_rules.cache_clear()
    cold = spacy_rules._doc_tokens(text)
    assert cold == spacy_rules._doc_tokens(text) == ("a", " ", "[", ":", ")", "´", "pm")


def test_the_cache_is_forgotten_between_texts_not_inside_one(monkeypatch):
    """Past its limit the chunk cache is emptied before the next text, so a text's step 5 across chunks
    still sees which of its chunks step 5 changed."""
    monkeypatch.setattr(spacy_rules, "_CACHE_LIMIT", 3)
    spacy_rules.cache_clear()
    assert spacy_rules.words("x :)´pm") == ("x", ":)", "´", "pm")
    assert spacy_rules.words("p q r s t [ :)´pm") == ("p", "q", "r", "s", "t", "[", ":", ")", "´", "pm")
    assert len(spacy_rules._CACHE) > 3        # filled past the limit inside that text, not emptied there
    spacy_rules.words("y")
    assert set(spacy_rules._CACHE) == {"y"}


def test_infixes_found_by_their_first_character_are_the_full_patterns():
    """The infix pattern that begins with one class of first characters (texts within the Basic Multilingual
    Plane) finds the same infixes as the pattern of alternatives, on every character of the plane in
    contexts that exercise each alternative; and the URL match without a user part equals the full one
    on chunks without `@`."""
    rules = spacy_rules._rules()
    contexts = ("a{c}b", "A{c}B", "1{c}2", "a{c}B", "1{c}a", "{c}", "a{c}{c}b", "a-{c}-b", "é{c}Ж", "'{c}'",
                '"{c}A')
    for c in map(chr, [*range(0x21, 0xD800), *range(0xE000, 0x10000)]):
        for context in contexts:
            s = context.format(c=c)
            assert [m.span() for m in rules._infix_bmp(s)] == [m.span() for m in rules._infix_any(s)], s
    for s in ("example.com", "http://a.b/c", "a.b.c(d)", "jax.jit(f)", "1.2.3.4", "8.8.8.8:80/x", "a.co:99",
              "x" * 40 + ".org", "ftp://x.y", "a:b.cd", "model.encode(x)", "www.a-b.io/?q=1#f"):
        assert bool(rules._url(s)) == bool(rules._url_user(s)), s


def test_infix_pieces_are_the_text_around_the_infixes():
    """`re.split` of the infix pattern as one group (`_split`'s infixes) gives the text before, between
    and after `infix`'s matches, and the matches, none empty, alternately; within the Basic Multilingual
    Plane and beyond it."""
    rules = spacy_rules._rules()
    pieces = [*"aAzZéд中19", *".,:;-–—~/=+*^…'’<>😀♥", "--", "...", "😀x"]
    rng = random.Random(3)
    for _ in range(20000):
        s = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 12)))
        split = rules.infix_pieces(s)
        spans = [m.span() for m in rules.infix(s)]
        ends = [0, *(x for span in spans for x in span), len(s)]
        assert split[1::2] == [s[a:b] for a, b in spans] and all(split[1::2]), s
        assert split[::2] == [s[a:b] for a, b in zip(ends[::2], ends[1::2])], s


def _generated_chunks(n: int, seed: int) -> list[str]:
    """Chunks of `_quick`'s shapes and near them: letters (some not `isalnum`: a Devanagari vowel sign, a
    Hebrew point), digits of several kinds, and the characters the shapes split at."""
    pieces = [*"abcXYZ019.,:/'’-()", "\u093f", "\u05b4", "क", "א", "²", "½", "٣", "ß", "ǅ", "s", "S", "'s",
              "—", "...", "_", "e.g", "Dr", "n't"]
    rng = random.Random(seed)
    return ["".join(rng.choice(pieces) for _ in range(rng.randint(1, 10))) for _ in range(n)]


def test_quick_gives_the_rules_tokens_or_leaves_the_chunk_to_them():
    for chunk in _generated_chunks(30000, 4):
        quick = spacy_rules._quick(chunk)
        assert quick is None or quick == spacy_rules._join_specials(spacy_rules._split(chunk, True)), chunk


def test_quick_with_marks_inside_tries_the_one_shape_that_can_take_the_chunk():
    """`_quick_marked`'s reasoning: no letter of spaCy's is one of the characters by which it picks the shape
    (so the three shapes' inner characters are disjoint), `re`'s letters of the apostrophe shape are
    `str.isalnum`; and it takes each of the three shapes, with such letters too."""
    alpha = re.compile(spacy_rules._class(spacy_rules._classes()["alpha"]))
    assert not any(map(alpha.match, ".,:/'’"))
    every = "".join(map(chr, [*range(0xD800), *range(0xE000, sys.maxunicode + 1)]))
    assert all(c.isalnum() for c in re.findall(r"[^\W\d_]", every))
    for chunk, tokens in [("1,000.5", ("1,000.5",)), ("12:30", ("12:30",)), ("9/11/2001", ("9/11/2001",)),
                          ("dog's", ("dog", "'s")), ("O’Brien", ("O’Brien",)), ("Rock'n", ("Rock'n",)),
                          ("well-known", ("well", "-", "known")), ("कि-का", ("कि", "-", "का")),
                          ("aְb-xy", ("aְb", "-", "xy"))]:
        assert spacy_rules._quick(chunk) == tokens == spacy_rules.tokens(chunk), chunk
    for chunk in ("urllib.parse", "'key':", "(a.k.a.", "x'y'z", "a-b.c", "a-b's", "1.5-2", "a—b-c"):
        assert spacy_rules._quick(chunk) is None, chunk


def test_the_splitter_by_name_is_the_default_and_needs_no_library():
    split = words.splitter("spacy_rules")
    assert words.DEFAULT == "spacy_rules" and gopher.GopherQuality().splitter == "spacy_rules"
    assert split(CASES[0][0]) == tuple(CASES[0][1].split(" ")) and split.sentences("It works. Yes!") == 2
    again = pickle.loads(pickle.dumps(split))
    assert again == split and again(CASES[1][0]) == tuple(CASES[1][1].split(" "))
    assert gopher.GopherQuality().problem() == "" and words.problem("spacy_rules") == ""


def test_the_clean_key_names_the_rules_version(monkeypatch):
    config = clean.Config(gopher_quality=gopher.GopherQuality(splitter="spacy_rules"))
    assert clean.key_inputs(config)["splitters"] == {"spacy_rules": {"spacy_rules": spacy_rules.VERSION}}
    before = clean.key_inputs(config)
    monkeypatch.setattr(spacy_rules, "VERSION", "2: other rules")
    assert clean.key_inputs(config) != before


def test_top_n_grams_by_hash_count_as_counter_does():
    """GopherRepetition's most frequent n-gram, by hash in numpy (`ngrams.NGrams.top`), equals `Counter`'s,
    ties (the first seen wins) included."""
    rng = random.Random(0)
    for _ in range(300):
        vocabulary = ["a", "b", "ab", "c", "bc", "the", "of"][:rng.randint(1, 7)]
        tokens = tuple(rng.choice(vocabulary) for _ in range(rng.randint(2, 60)))
        grams = ngrams.NGrams(tokens)
        for n in (2, 3, 4):
            if len(tokens) >= n:
                assert ngrams.top_n_gram_chars(tokens, n, grams) == ngrams.top_n_gram_chars(tokens, n)


# ---------------------------------------------------------------------------------------------
# Against spaCy itself, where it is installed

@pytest.fixture(scope="module")
def spacy_split():
    pytest.importorskip("spacy")
    return words.splitter("spacy")


def test_special_cases_are_spacys_table(spacy_split):
    from spacy.symbols import ORTH

    rules = spacy_split._library().tokenizer.rules
    assert {key: tuple(t[ORTH] for t in tokens) for key, tokens in rules.items()} == spacy_rules.SPECIALS


def test_prefix_suffix_infix_and_url_rules_are_spacys_on_every_character(spacy_split):
    """Each character of the Basic Multilingual Plane and the emoji planes, in contexts that exercise every
    rule (before and after letters of either case and digits, before a period, doubled)."""
    tokenizer = spacy_split._library().tokenizer
    rules = spacy_rules._rules()
    contexts = ("{c}a", "a{c}", "1{c}", "AB{c}.", "{c}.", "a{c}b", "1{c}2", "a{c}B", "{c}{c}", "x{c}.")
    code_points = [*range(0x21, 0x3000, 1), *range(0x3000, 0x10000, 7), *range(0x1F000, 0x1FC00)]
    for c in map(chr, code_points):
        if c.isspace():
            continue
        for context in contexts:
            s = context.format(c=c)
            ours = (rules.prefix(s), rules.suffix(s), [m.span() for m in rules.infix(s)], bool(rules.url(s)))
            assert ours == (tokenizer.find_prefix(s), tokenizer.find_suffix(s),
                            [m.span() for m in tokenizer.find_infix(s)], bool(tokenizer.url_match(s))), s


def test_tokens_and_sentences_are_spacys_on_real_pages(spacy_split):
    """The pypi pages shipped with the benchmarks: project pages with prose, code, paths and URLs."""
    with gzip.open(PYPI_PAGES, "rt", encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line in f]
    spacy_rules.cache_clear()
    for text in texts:
        assert spacy_rules.words(text) == spacy_split(text)
        for line in text.splitlines():
            if line.strip():
                assert spacy_rules.sentences(line) == spacy_split.sentences(line.strip()), line


def test_tokens_and_sentences_are_spacys_on_generated_strings(spacy_split):
    pieces = [*"aAzZéдα中ʔ19", *".,:;!?'\"()[]{}<>-–—~/=+*^%$€°#@&_…’‘“”«»|\\`´", "km", "US$", "n't", "'s",
              "http://", ".com", "www.", "e.g.", ":)", "):", "°C", "😀", "🥱", "♥", "\xa0", "  ", "\t", "\n",
              " ", " ", " ", "can", "not", "Dr", "pm", "10", "''", "8", "D", "3"]
    rng = random.Random(1)
    spacy_rules.cache_clear()
    for _ in range(3000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 14)))
        assert spacy_rules.words(text) == spacy_split(text), text
        if text.strip():
            assert spacy_rules.sentences(text) == spacy_split.sentences(text.strip()), text
