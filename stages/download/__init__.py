"""The download stage: reads one source and writes its documents as parquet shards.

    make stage STAGE=download                    (gin/tiny.gin: the embedded corpus)
    python -m pipeline run --gin gin/data/fineweb.gin
    python -m pipeline run --gin gin/twins/commoncrawl.gin    (raw Common Crawl WARC: `warc.py`)

Writes into `out_dir`:
    docs-00000-of-0000N.parquet   columns id, text, url, source, error, metadata (`stages.io.documents`)
    stats.json                    {"docs", "bytes" (UTF-8 bytes of text), "shards", "units",
                                   "errors": {reason: docs}, "by_source": {source: docs},
                                   "bad_files": {path: why it could not be read to its end},
                                   "revision": the hub commit read (FineWeb on the hub only)}

A source lists its work as units (a batch of files, a parquet row group, a range of records,
see `sources.py`). The driver deals them round-robin into `min(num_shards, len(units))` groups;
a Beam worker streams each group's units, in order, into one shard. Elements are groups, never
documents, and the same source and config always give the same bytes.

The key covers the inputs (`key_inputs`): each source states what it will read as a fingerprint,
from a listing and never by reading a file, and that goes into the download key and so into every
key after it. Adding, removing or rewriting an input changes it; rerunning, another cache root or
host, or a file the globs do not match does not.

    local files     path, size and modification time in ns (touching a file counts as rewriting it:
                    the content is not read; a rewrite that keeps both size and time is not seen)
    gs:// objects   path and generation (every upload gets a new one); Files and Warc alike
    FineWeb         each file's git blob id on the hub (a content hash; one listing call, which needs
                    the network: offline, `plan` shows the download key as unknown and `run` stops)
    Tfds            the dataset name (with its version, if given) and the installed TFDS version
    Embedded        the interpreter and its version, whose standard library is the corpus
    EmbeddedCode    the same, as code

`--force` reruns the stage into the key of the inputs as they are now, reading them again.

A corrupt or truncated file (`document.BadFile`) fails the stage with its path and how far reading
got; with `skip_bad_files` the documents read before the damage are kept, the file is listed under
`bad_files` in stats.json and the rest is read. Fewer than `min_docs` documents with text fail the
stage, naming the source. A glob that matches nothing is an error when planning; one that matches a
directory or a file of an unsupported extension (`.json`), or a first record without the text field, is
one before the stage runs (`check`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from stages import beam_runner
from stages.download.document import BadFile
from stages.download.sources import SOURCES, Embedded, EmbeddedCode, Files, FineWeb, Tfds, Warc
from stages.io import storage
from stages.io.refusal import Refusal

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Config:
    """What to download and into how many shards; `runner` says where Beam runs (not in the key)."""

    source: Embedded | EmbeddedCode | Files | Tfds | FineWeb | Warc = dataclasses.field(
        default_factory=Embedded)
    num_shards: int = 8   # output shards; fewer when the source has fewer units
    # Both in the key: a cached output must be one that met them (a skipped file, an empty output).
    skip_bad_files: bool = False   # a damaged file: fail naming it, or (True) keep what was read and count it
    min_docs: int = 1              # fail when fewer documents with text come out; 0 allows an empty output
    runner: beam_runner.Runner = dataclasses.field(default_factory=beam_runner.Runner,
                                                   metadata={"key": False})

    def __post_init__(self):
        if not isinstance(self.source, SOURCES):
            raise TypeError(f"source={self.source!r} is not one of "
                             f"{', '.join('@download.' + s.__name__ + '()' for s in SOURCES)}")
        if isinstance(self.num_shards, int) and self.num_shards < 1:
            raise ValueError(f"num_shards={self.num_shards!r} must be >= 1")
        if isinstance(self.min_docs, int) and self.min_docs < 0:
            raise ValueError(f"min_docs={self.min_docs!r} must be >= 0")


CONFIGURABLES = (Config, *SOURCES)
# 2: stats.json lists bad_files; 3: shards have a metadata column; 4: jsonl/parquet records and FineWeb rows
# carry their other fields in metadata, FineWeb on the hub is read at a pinned commit (stats.json: revision);
# 5: metadata nested more than 64 levels deep is cut (it crashed the stage from a few hundred), and a jsonl
# integer of more than 4300 digits no longer makes its record malformed_json; 6: WARC request, metadata and
# warcinfo records are counted in stats.json's skipped_records instead of being written as documents;
# 7: a UTF-8 byte-order mark at the start of a jsonl or txt file is dropped (it made the first record
# malformed_json, or started the text with U+FEFF)
VERSION = "7"


def key_inputs(config: Config) -> Any:
    """What the source will read (its fingerprint), for the cache key: see the module docstring."""
    try:
        return config.source.fingerprint()
    except ValueError:
        raise                  # already names the glob (one that matches nothing)
    except Exception as e:     # a listing that failed (offline, no access): name what was being listed
        raise OSError(f"listing the files of {config.source!r}: {type(e).__name__}: {e}") from e


def check(config: Config) -> str:
    """What would fail the download before it starts, in one line, or "": the source's own `check()` where
    it has one (Files: a glob that matches a directory, an extension no reader takes, a first record
    without the text field). `python -m pipeline run` calls it when the stage is about to run."""
    source_check = getattr(config.source, "check", None)
    if source_check and (problem := source_check()):
        return problem
    # A source with no record fails the run (min_docs) after every other source's chain ran: say it now.
    records_problem = getattr(config.source, "records_problem", None)
    return records_problem() if records_problem and config.min_docs > 0 else ""


def run(config: Config, inputs: Mapping[str, Any], out_dir: str, work_dir: str) -> None:
    from stages.download import beam_graph

    units = config.source.units()
    groups = deal(units, config.num_shards)
    log.info("download: %d units from %s -> %d shards in %s", len(units), type(config.source).__name__,
             len(groups), out_dir)
    try:
        with beam_runner.pipeline(config.runner) as p:
            beam_graph.build(p, config.source, groups, out_dir, skip_bad_files=config.skip_bad_files,
                             provenance=provenance(config.source))
    except Exception as e:
        bad = _bad_file(e)
        if bad is None:
            raise
        raise BadFile(*bad.args) from None   # the one line that matters, not Beam's wrapping of it
    stats = storage.read_json(storage.join(out_dir, "stats.json"))
    with_text = stats["docs"] - sum(stats["errors"].values())
    if with_text < config.min_docs:
        raise Refusal(f"download: {with_text} documents with text (min_docs={config.min_docs}) from "
                         f"{len(units)} units of {config.source!r}; records without text: "
                         f"{stats['errors'] or 'none'}; files that could not be read: "
                         f"{stats['bad_files'] or 'none'}. Point the source at non-empty inputs, "
                         "or set download.Config.min_docs = 0 to allow an empty output")


def provenance(source: Any) -> dict:
    """What the source resolved while listing, for stats.json (FineWeb on the hub: `revision`)."""
    describe = getattr(source, "provenance", None)
    return describe() if describe else {}


def summary(out) -> str:
    """One line for the run summary, from a committed download (a `stages.io.committed.Committed`)."""
    s = storage.read_json(out.file("stats.json"))
    errors = ", ".join(f"{k} {v}" for k, v in sorted(s["errors"].items())) or "none"
    bad = f"; bad files: {len(s['bad_files'])}" if s.get("bad_files") else ""
    n = sum(s.get("skipped_records", {}).values())
    skipped = f"; skipped {n:,} records that are not pages (WARC requests, metadata)" if n else ""
    revision = f"; hub revision {s['revision'][:12]}" if s.get("revision") else ""
    return (f"{s['docs']:,} docs, {s['bytes'] / 1e6:.1f} MB in {s['shards']} shards; "
            f"bad records: {errors}{bad}{skipped}{revision}")


def _bad_file(e: BaseException | None) -> BadFile | None:
    """The first `BadFile` raised under a Beam failure, if any: the innermost of its chain of causes, since
    Beam re-raises an exception as a copy with "[while running 'Step']" added to its first argument."""
    found, seen = None, set()
    while e is not None and id(e) not in seen:
        found = e if isinstance(e, BadFile) else found
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return found


def deal(units: Sequence, num_shards: int) -> list[list]:
    """Units dealt round-robin into `min(num_shards, len(units))` groups (at least one, maybe empty)."""
    n = max(1, min(num_shards, len(units)))
    return [list(units[i::n]) for i in range(n)]
