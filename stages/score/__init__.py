"""The score stage: measure every downloaded document once, so that clean's thresholds can change without it.

    make stage STAGE=score                       # (normally it runs as clean's upstream)
    score.run(score.Config(clean=clean.Config()), {"download": downloaded, "classifier": trained},
              out_dir, work)

Reads download's `docs-*.parquet` and writes, per download shard, a score table (stages/score/table.py):

    scores-XXXXX-of-YYYYY.parquet   one row per downloaded document, in download's order: the text clean
                                    would write, each filter's measured attributes (`filters.measure`), the
                                    exact-duplicate key, MinHash band keys, the yardstick items it shares an
                                    n-gram with, and the model scores (`quality`: the classifier stage's
                                    probability of its positive label, when classifier.Config names one)
    stats.json                      {docs, fixed: {reason: docs}, shards, errors: download's error counts}

Cleaning is two nodes: this one measures (normalization, every switched-on filter's statistics, language id,
duplicate keys, MinHash signatures, contamination matches, model scores), and clean selects (the thresholds,
`keep_fraction`, exact and near dedup among the survivors, the contamination drop). Its config is clean's
(`follow` copies the node's `clean.Config`, scoped bindings included) and its key covers only what changes a
measurement (`keyed`): normalization, which filters are on and their scoring fields (`filters.scoring_key`:
word splitter, n-gram sizes, URL lists, C4's line rules, ...), the MinHash parameters and the yardsticks
checked. A threshold (`clean.GopherQuality.min_doc_words`, `clean.Config.min_chars`, a `keep_fraction`)
changes clean's key alone, so `make sweep SWEEP=gin/sweeps/min_chars.gin` scores once and selects per variant.

Cost: it measures every document with every filter (cleaning in one pass stopped at the first failing one),
and hashes and checks for contamination every document rather than the survivors: the price of never doing
it again for a threshold.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping

from stages.clean import checks as clean_checks
from stages.clean import filters
from stages.clean.config import Config as CleanConfig
from stages.clean.config import scoring_filters
from stages.io import documents, storage
from stages.score.table import shards_of

__all__ = ["CONFIGURABLES", "VERSION", "Config", "check", "check_upstream", "follow", "key_inputs", "keyed",
           "run", "shards_of", "summary"]

log = logging.getLogger(__name__)

VERSION = "1"


@dataclasses.dataclass(frozen=True)
class Config:
    """Not bound in gin: `follow` sets `clean` to the node's clean.Config (its runner runs this stage too)."""

    clean: CleanConfig = dataclasses.field(default_factory=CleanConfig)

    def __post_init__(self):
        if not isinstance(self.clean, CleanConfig):
            raise ValueError(f"clean={self.clean!r} must be a clean.Config (score follows clean's config; "
                             "bind clean.Config, never score.Config)")


CONFIGURABLES = (Config,)


def follow(config: Config, configs: Mapping) -> Config:
    """`config` measuring what clean's config switches on: `configs["clean"]` (the node's own, with its
    source's scoped bindings), its contamination check following yardsticks (`clean.follow`)."""
    return dataclasses.replace(config, clean=clean_checks.follow(configs["clean"], configs))


def keyed(config: Config) -> dict:
    """What the key covers: every setting that changes a row of the score table, and no threshold."""
    c = config.clean
    check = c.contamination
    return {"normalize": {"unicode_nfc": c.unicode_nfc, "remove_control_chars": c.remove_control_chars,
                          "tidy_whitespace": c.tidy_whitespace},
            "max_chars": c.max_chars,       # a longer text is measured for its length alone
            "filters": [filters.scoring_key(f) for f in scoring_filters(c)],
            "minhash": {"ngram": c.minhash_ngram, "bands": c.minhash_bands, "rows": c.minhash_rows,
                        "seed": c.minhash_seed} if c.minhash else None,
            "contamination": {"reference_sets": list(check.checked_sets), "tasks": list(check.checked_tasks),
                              "n": check.n, "max_items": check.max_items} if check.active else None}


def key_inputs(config: Config) -> dict | None:
    """clean's: the URL filter's list files and the word splitters' fingerprints (`clean.key_inputs`)."""
    return clean_checks.key_inputs(config.clean)


def check_upstream(config: Config, upstream: dict) -> str:
    """What clean's selection would refuse of the scores this stage writes, before any work: a ranking by
    `quality` with the classifier off."""
    keep_top, found = config.clean.keep_top, upstream.get("classifier")
    if keep_top is not None and keep_top.score == "quality" and found is not None and found.off:
        return ("clean.KeepTop.score='quality' ranks by the quality classifier, which is off: name its "
                "classes (classifier.Config.positives = @positives/download.Files(), "
                "classifier.Config.negatives = @negatives/download.Files()) or a published model "
                "(classifier.Config.pretrained), or rank with clean.KeepTop.score='random'")
    return ""


def check(config: Config) -> str:
    """clean's check: what would fail the first document (a filter's library or model missing)."""
    return clean_checks.check(config.clean)


def run(config: Config, inputs: Mapping, out_dir: str, work_dir: str) -> None:
    from stages.score import graph  # Beam loads only when the stage actually runs

    paths = documents.shards_of(inputs["download"])
    log.info("score: %d download shards -> score tables in %s", len(paths), out_dir)
    start = time.time()
    from stages import classifier
    model = classifier.scorer(inputs["classifier"]) if "classifier" in inputs else None   # None: off
    graph.run(config.clean, paths, out_dir, model)
    stats = storage.read_json(storage.join(out_dir, "stats.json"))
    download_stats = (inputs["download"].file("stats.json") if "stats.json" in inputs["download"].files
                      else None)
    stats["errors"] = storage.read_json(download_stats).get("errors", {}) if download_stats else {}
    storage.write_json(storage.join(out_dir, "stats.json"), stats)
    wall = time.time() - start
    log.info("score: %d docs in %.1f s (%.0f docs/s); fixed: %s", stats["docs"], wall,
             stats["docs"] / max(wall, 1e-9), stats["fixed"])


def summary(out) -> str:
    """One line for the run summary, from a committed score stage."""
    s = storage.read_json(out.file("stats.json"))
    fixed = ", ".join(f"{k} {v:,}" for k, v in sorted(s["fixed"].items(), key=lambda kv: -kv[1]))
    return f"scored {s['docs']:,} docs in {s['shards']} tables; unscored: {fixed or 'none'}"
