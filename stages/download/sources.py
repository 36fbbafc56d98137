"""The sources download reads: one frozen dataclass each, configurable in gin as `download.<Class>`.

    download.Config.source = @download.Files()
    download.Files.paths = ["gs://bucket/crawl/*.jsonl.gz"]

A source has three methods (and may have a fourth, `check() -> str`: what would fail its run, found
cheaply before any stage starts, in one line; `download.check` calls it):

    fingerprint() -> JSON   what it will read, without reading it, for the download key (on the
                            planning machine, whenever a plan is made): it changes when an input is
                            added, removed or rewritten, and nothing else changes it
    units() -> list         cheap, deterministic, sorted, picklable pieces of work (on the driver)
    read(unit) -> Iterator  the documents of one unit, in order (on a Beam worker), as dicts with
                            the `stages.io.documents` columns; bad records become documents with an
                            `error` (see `document.py`) rather than exceptions, a damaged file raises
                            `document.BadFile` after the documents read before the damage

Add a source: a dataclass here with those three methods, appended to `SOURCES`.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import zlib
from collections.abc import Iterator, Mapping
from importlib import metadata

from stages.download import embedded, formats, templates
from stages.download.document import MISSING, doc_id, field, plain_str, text_or_error
from stages.io import storage

log = logging.getLogger(__name__)


# The tokens a document can hold beyond one per byte of its text: sentencepiece's dummy prefix, bos and eos.
# A source's optional `text_bound()` counts them, so that planning can bound a source's tokens from a listing
# (each other token is a piece of at least one character, or one byte of byte fallback): train refuses a
# mixture that would repeat a source past its limit even if every byte became a token (stages/train).
TOKENS_PER_DOC = 3


@dataclasses.dataclass(frozen=True)
class Embedded:
    """Standard-library docstrings and pydoc help topics (~2 MB of English prose); no network."""

    max_files: int = 0            # 0 = every stdlib module; N = the first N in sorted order (tests)
    include_topics: bool = True   # also the pydoc help topics (~0.46 MB)

    def __post_init__(self):
        _check_at_least("Embedded.max_files", self.max_files, 0)

    def fingerprint(self) -> dict:
        return {"corpus": embedded.version()}

    def units(self) -> list[tuple[str, ...]]:
        return embedded.units(self.max_files, self.include_topics)

    def text_bound(self) -> int:
        """At least the bytes of text plus TOKENS_PER_DOC per document it yields (a docstring's quotes hold
        them): what bounds its tokens before anything runs (see TOKENS_PER_DOC)."""
        return embedded.size(self.units())

    def read(self, unit: tuple[str, ...]) -> Iterator[dict]:
        return embedded.read(unit)


@dataclasses.dataclass(frozen=True)
class EmbeddedCode:
    """The standard library's Python source, one document per module (~11 MB on CPython 3.11 for every
    module; `max_files` keeps the first N in sorted order); no network. Code for a prose + code mixture."""

    max_files: int = 0            # 0 = every stdlib module
    skip_files: int = 0           # leave out the first N modules: a held-out code set past a training one

    def __post_init__(self):
        _check_at_least("EmbeddedCode.max_files", self.max_files, 0)
        _check_at_least("EmbeddedCode.skip_files", self.skip_files, 0)

    def fingerprint(self) -> dict:
        return {"corpus": embedded.version(), "kind": "code"}

    def units(self) -> list[tuple[str, ...]]:
        return embedded.units(self.max_files, include_topics=False, skip=self.skip_files)

    def text_bound(self) -> int:
        """The modules' bytes plus TOKENS_PER_DOC for each: one document per module, its source as it is."""
        units = self.units()
        return embedded.size(units) + TOKENS_PER_DOC * sum(map(len, units))

    def read(self, unit: tuple[str, ...]) -> Iterator[dict]:
        return embedded.read_code(unit)


@dataclasses.dataclass(frozen=True)
class Files:
    """Local or gs:// files by glob; the format follows the extension (`formats.SUFFIXES`).

    Fields are paths into a record: "text", or "metadata.url" for a nested object (Dolma) or a parquet
    struct column; a key that holds a dot is found whole first. A jsonl or parquet record's other fields
    go into the `metadata` column as a JSON object: `metadata_fields = ("*",)` all of them, `()` none, or
    the paths to keep, e.g. `("metadata.date", "source")`. Instruction-tuning records (`instruction`,
    `input`, `output`, or chat `messages`) become text through `template` (templates.py):

        download.Files.template = "alpaca"       # or "chatml", or "Q: {instruction} {input}\nA: {output}"
        download.Files.message_formats = {"user": "User: {content}\n", "*": "{role}: {content}\n"}
    """

    paths: tuple[str, ...] = ()   # globs, e.g. ("gs://bucket/crawl/*.jsonl.gz", "/data/*.parquet")
    text_field: str = "text"      # the path of the text: a JSON key or parquet column, or "a.b" nested
    id_field: str = ""            # the record's own id; "" (or absent) = a hash of file and position
    url_field: str = "url"        # the record's URL, e.g. "metadata.url"; absent = "path:line"
    txt_unit: str = "file"        # .txt: "file" = one document per file; "paragraph" = split on blank lines
    metadata_fields: tuple[str, ...] = ("*",)   # the record's other fields into `metadata`; () = none
    template: str = ""            # "" = the text field; "alpaca", "chatml" or a format string (templates.py)
    message_formats: tuple[tuple[str, str], ...] | Mapping[str, str] = ()   # role -> "{role}: {content}"

    TXT_UNITS = ("file", "paragraph")

    def __post_init__(self):
        object.__setattr__(self, "paths", _globs("Files.paths", self.paths, '["data/*.jsonl.gz"]'))
        if self.text_field == "":
            raise ValueError("Files.text_field is empty; "
                             "set it to the JSON key or parquet column holding the text")
        if self.txt_unit not in self.TXT_UNITS:
            raise ValueError(f"Files.txt_unit={self.txt_unit!r} is not one of {self.TXT_UNITS}")
        object.__setattr__(self, "metadata_fields", _metadata_fields("Files", self.metadata_fields))
        if isinstance(self.message_formats, Mapping):   # gin gives a dict: a sorted tuple hashes and pickles
            object.__setattr__(self, "message_formats", tuple(sorted(self.message_formats.items())))
        if self.message_formats and not self.template:
            raise ValueError("Files.message_formats is set but Files.template is empty; set a template "
                             f"({', '.join(map(repr, templates.NAMES))} or a format string)")
        try:
            self.fields()
        except ValueError as e:
            raise ValueError(f"Files.{e}") from None

    def fingerprint(self) -> dict[str, str]:
        """Every matched file -> its version (`storage.versions`: local size and mtime, gs:// generation)."""
        return _fingerprint("download.Files.paths", self.paths, "*.jsonl")

    def check(self) -> str:
        """What would fail the run, found before it starts, in one line ("" when nothing): a glob that
        matches a directory, a file whose extension no reader takes (`formats.SUFFIXES`), and, unless a
        template makes the text, a first record without `text_field`: the first non-blank line of the
        first jsonl file, the schema (footer) of the first parquet file. It lists the globs and reads at
        most that line and that footer; what it cannot read is left for the run to name."""
        first: dict[str, str] = {}      # format -> its first file
        for pattern in self.paths:
            files = storage.versions(pattern)            # regular files only, as the key lists them
            where = f"download.Files.paths: {pattern!r} matches"
            for path in storage.glob(pattern):
                if path not in files:
                    return (f"{where} the directory {path}; match files only, e.g. "
                            f"{storage.join(path, '*.jsonl')!r}")
                try:
                    fmt = formats.file_format(path)
                except ValueError:
                    json = " (.json is not read: a file of one JSON object per line is .jsonl)" \
                        if path.endswith((".json", ".json.gz")) else ""
                    return (f"{where} {path}, an extension no reader takes{json}; supported are "
                            f"{', '.join(formats.SUFFIXES)}")
                first[fmt] = min(first.get(fmt, path), path)
        if self.template:
            return ""
        if "jsonl" in first and (problem := _first_record_problem(first["jsonl"], self.text_field)):
            return problem
        if "parquet" in first:
            try:
                formats.parquet_row_groups([first["parquet"]], self.text_field,
                                           hint="; set download.Files.text_field to the text column")
            except ValueError as e:
                return f"download.Files.text_field={self.text_field!r}: {e}"
            except OSError:
                return ""        # unreadable here (the network, a permission): the run says which
        return ""

    def records_problem(self) -> str:
        """Why the files matched hold no record at all, in one line, or "": they are read in order, each up to
        its first record (jsonl or txt: a non-blank line; parquet: its footer's row count), until one holds
        one, so a source with documents costs the first line of its first file. What cannot be read is
        left for the run to name."""
        matched = sorted({p for pattern in self.paths for p in storage.versions(pattern)})
        for path in matched:
            try:
                if _holds_a_record(path):
                    return ""
            except (OSError, EOFError, zlib.error, ValueError):
                return ""
        if not matched:
            return ""                 # a glob that matches nothing: the key's listing names it
        shown = ", ".join(matched[:3]) + (f" and {len(matched) - 3} more" if len(matched) > 3 else "")
        return (f"download.Files.paths: the {len(matched)} file(s) matched hold no record ({shown}: empty or "
                "blank); point the source at files with documents, or set download.Config.min_docs = 0 to "
                "allow an empty output")

    def text_bound(self) -> int | None:
        """At least the bytes of text plus TOKENS_PER_DOC per document the files hold, from a listing of local
        files, or None when that cannot bound it: compressed files and parquet (their bytes are not the
        text's), a template (it adds text), gs:// or hub files (planning lists nothing remote). A jsonl record
        spends more bytes than its text's (`{"text":""}` and the newline cover TOKENS_PER_DOC); a .txt file
        is one document, or (txt_unit "paragraph") paragraphs of at least one byte between blank lines: at
        most twice its bytes."""
        if self.template or not all(storage.is_local(p) for p in self.paths):
            return None          # a remote listing would need the network, and `make plan` works offline
        total, sizes = 0, {p: s for pattern in self.paths for p, s in storage.file_sizes(pattern).items()}
        for path, size in sizes.items():
            try:
                fmt = formats.file_format(path)
            except ValueError:
                return None          # download's own check names the file
            if path.endswith(".gz") or fmt == "parquet":
                return None
            if fmt == "jsonl":
                total += size
            else:
                total += (2 * size + 2) if self.txt_unit == "paragraph" else size + TOKENS_PER_DOC
        return total

    def units(self) -> list[tuple[str, int]]:
        found: set[str] = set()
        for pattern in self.paths:
            found.update(_matching(storage.glob(pattern), f"download.Files.paths: {pattern!r}"))
        return formats.units(sorted(found), None if self.template else self.text_field,
                             hint="; set download.Files.text_field to the text column")

    def read(self, unit: tuple[str, int]) -> Iterator[dict]:
        return formats.read(*unit, self.fields())

    def fields(self) -> formats.Fields:
        template = templates.Template.named(self.template, self.message_formats) if self.template else None
        return formats.Fields(text=self.text_field, id=self.id_field, url=self.url_field,
                              txt_unit=self.txt_unit, source="files", metadata=self.metadata_fields,
                              template=template)


@dataclasses.dataclass(frozen=True)
class Tfds:
    """A TensorFlow Datasets dataset, read with `as_data_source` (array_record; no TensorFlow needed).

    When the dataset is not prepared in `data_dir`, `units()` prepares it there first
    (`download_and_prepare`, which downloads). On a distributed runner `data_dir` must be storage
    that every worker can read.
    """

    name: str = ""                # a TFDS name, optionally with config and version: "wikipedia/20230601.en"
    split: str = "train"          # any TFDS split spec: "train", "train[:10%]", "validation+test"
    data_dir: str = ""            # "" = TFDS's default (~/tensorflow_datasets)
    text_key: str = "text"        # the feature holding the text
    records_per_unit: int = 10_000

    def __post_init__(self):
        if self.name == "":
            raise ValueError('Tfds.name is empty; set it to a TFDS dataset name, e.g. "imdb_reviews"')
        if self.split == "":
            raise ValueError('Tfds.split is empty; set it to a split such as "train"')
        _check_at_least("Tfds.records_per_unit", self.records_per_unit, 1)

    @property
    def source(self) -> str:
        return f"tfds/{self.name}"

    def fingerprint(self) -> dict:
        # A TFDS version names its content; a name without one means the newest version the installed
        # library knows, so the library's version stands in for it (read without importing TFDS).
        try:
            library = metadata.version("tensorflow-datasets")
        except metadata.PackageNotFoundError:
            library = "not installed"
        return {"dataset": self.name, "tensorflow-datasets": library}

    def units(self) -> list[tuple[int, int]]:
        count = len(self._records(prepare=True))
        step = self.records_per_unit
        return [(start, min(start + step, count)) for start in range(0, count, step)]

    def read(self, unit: tuple[int, int]) -> Iterator[dict]:
        records = self._records()
        for chunk in range(unit[0], unit[1], formats.BATCH_ROWS):
            indices = list(range(chunk, min(chunk + formats.BATCH_ROWS, unit[1])))
            for i, record in zip(indices, records.__getitems__(indices)):
                text, error = text_or_error(record.get(self.text_key) if isinstance(record, dict) else None)
                yield {"id": doc_id(self.source, self.split, i), "text": text,
                       "url": f"tfds:{self.name}:{self.split}:{i}", "source": self.source, "error": error}

    def _records(self, prepare: bool = False):
        """The split as a random-access data source (len, __getitems__)."""
        import tensorflow_datasets as tfds

        builder = tfds.builder(self.name, data_dir=self.data_dir or None, file_format="array_record")
        if prepare and not builder.is_prepared():
            log.info("download: preparing TFDS %s into %s", self.name, builder.data_dir)
            builder.download_and_prepare()
        return builder.as_data_source(split=self.split)


@dataclasses.dataclass(frozen=True)
class FineWeb:
    """FineWeb parquet (https://huggingface.co/datasets/HuggingFaceFW/fineweb), one unit per row group.

    `root` is any storage URL laid out like the hub repository: `hf://` (huggingface_hub's fsspec
    filesystem; set HF_TOKEN for higher rate limits), a gs:// mirror, or a local copy. On the hub,
    `revision` (a branch, tag or commit) is resolved to its commit once, by the first `fingerprint()` or
    `units()` of this config, and every file is listed and read at that commit (`commit`), so a push
    during a run changes nothing; download's stats.json records it as `revision`. The key holds each
    file's content hash (git blob id) by its path without the commit, so a new commit that leaves the
    files alone leaves the key alone. Columns other than text, id and url (`dump`, `date`, `file_path`,
    `language`, `language_score`, `token_count`, FineWeb-Edu's `score`...) go into `metadata`.
    """

    root: str = storage.hub_url("datasets/HuggingFaceFW/fineweb")
    pattern: str = "sample/10BT/*.parquet"   # or "data/CC-MAIN-2024-10/*.parquet", "sample/100BT/*.parquet"
    max_files: int = 0                       # 0 = every matching file; N = the first N in sorted order
    revision: str = "main"                   # on the hub: the branch, tag or commit to pin (see above)
    metadata_fields: tuple[str, ...] = ("*",)   # other columns into `metadata`: ("*",) all, () none, names

    COLUMNS = ("text", "id", "dump", "url")
    HINT = " (check root and pattern)"

    def __post_init__(self):
        if self.root == "" or self.pattern == "":
            raise ValueError(f"FineWeb.root={self.root!r} and FineWeb.pattern={self.pattern!r} "
                             "must both be set")
        _check_at_least("FineWeb.max_files", self.max_files, 0)
        if not self.revision:
            raise ValueError('FineWeb.revision is empty; set it to a branch, tag or commit, e.g. "main"')
        if self.revision != "main" and not storage.is_hub(self.root):
            raise ValueError(f"FineWeb.revision={self.revision!r} needs a root on the hub; "
                             f"root={self.root!r} is not (leave revision as \"main\")")
        object.__setattr__(self, "metadata_fields", _metadata_fields("FineWeb", self.metadata_fields))

    @functools.cached_property
    def pinned(self) -> tuple[str, str | None]:
        """(the root to list and read, the commit it is pinned to, or None off the hub): resolved once
        per config object, so its fingerprint and its units see the same commit."""
        if not storage.is_hub(self.root):
            return self.root, None
        root, commit = storage.hub_commit(self.root, self.revision)
        log.info("download: %s at %s is commit %s", self.root, self.revision, commit)
        return root, commit

    @property
    def commit(self) -> str | None:
        return self.pinned[1]

    def provenance(self) -> dict:
        """What download's stats.json records of the source: the hub commit it read."""
        return {"revision": self.commit} if self.commit else {}

    def fingerprint(self) -> dict[str, str]:
        """Every file it reads -> its version: on the hub its git blob id (a hash of its content), from the
        same kind of listing `units` makes (a network call; offline, planning says it cannot list), by its
        path without the commit."""
        root = self.pinned[0]
        versions = _matching(storage.versions(self.glob), f"download.FineWeb: {self.glob!r}", self.HINT)
        return {self.root + path[len(root):] if path.startswith(root) else path: versions[path]
                for path in self._first(sorted(versions))}

    def units(self) -> list[tuple[str, int]]:
        files = self._first(_matching(storage.glob(self.glob), f"download.FineWeb: {self.glob!r}", self.HINT))
        counts = formats.parquet_row_groups(files, "text")
        return [(path, g) for path, n in zip(files, counts) for g in range(n)]

    @property
    def glob(self) -> str:
        return storage.join(self.pinned[0], self.pattern)

    def _first(self, files: list[str]) -> list[str]:
        return files[:self.max_files] if self.max_files else files

    def read(self, unit: tuple[str, int]) -> Iterator[dict]:
        path, row_group = unit
        every = formats.ALL in self.metadata_fields
        columns = None if every else list(dict.fromkeys(self.COLUMNS + self.metadata_fields))
        for row, record in formats.parquet_rows(path, columns, row_group):
            source = f"fineweb/{plain_str(record.get('dump')) or 'unknown'}"
            text, error = text_or_error(record.get("text"))
            own_id, own_url = plain_str(record.get("id")), plain_str(record.get("url"))
            taken = ["text"] + [name for name, value in (("id", own_id), ("url", own_url)) if value]
            yield {"id": own_id or doc_id("fineweb", path, row), "text": text,
                   "url": own_url or f"{path}:{row}", "source": source, "error": error,
                   "metadata": formats.metadata(record, taken, self.metadata_fields)}


@dataclasses.dataclass(frozen=True)
class Warc:
    """Raw Common Crawl: WARC files (HTML responses -> main text) and WET files (their text as is), local
    or gs://, gzipped per record or not; one unit per file. What becomes of each record, and the reasons
    a record gives no text, are in `warc.py`.

        download.Warc.paths = ["gs://bucket/CC-MAIN-2024-10/segments/*/warc/*.warc.gz"]
        download.Warc.extractor = "resiliparse"
    """

    paths: tuple[str, ...] = ()        # globs of .warc, .warc.gz, .wet, .warc.wet.gz files
    extractor: str = "trafilatura"     # FineWeb's (as datatrove configures it), or "resiliparse"

    EXTRACTORS = ("trafilatura", "resiliparse")   # warc.EXTRACTORS, kept here so planning imports no warcio

    def __post_init__(self):
        object.__setattr__(self, "paths", _globs("Warc.paths", self.paths, '["crawl/*.warc.gz"]'))
        if self.extractor not in self.EXTRACTORS:
            raise ValueError(f"Warc.extractor={self.extractor!r} is not one of {self.EXTRACTORS}")

    def fingerprint(self) -> dict:
        """Every matched file -> its version (`storage.versions`: local size and mtime, gs:// generation),
        and the installed extractor's version: trafilatura's text changes between releases (FineWeb's
        recipe ran 1.8, README "FineWeb's recipe"), so another version is another key (as for Tfds)."""
        try:
            library = metadata.version(self.extractor)
        except metadata.PackageNotFoundError:
            library = "not installed"
        files = _fingerprint("download.Warc.paths", self.paths, "*.warc.gz")
        return {"files": files, self.extractor: library}

    def units(self) -> list[str]:
        from stages.download import warc

        found: set[str] = set()
        for pattern in self.paths:
            found.update(_matching(storage.glob(pattern), f"download.Warc.paths: {pattern!r}"))
        for path in found:
            warc.check_path(path)
        warc.extractor(self.extractor)   # a missing extractor package fails here, before any worker starts
        return sorted(found)

    def read(self, unit: str) -> Iterator[dict]:
        from stages.download import warc

        return warc.read(unit, self.extractor)


SOURCES = (Embedded, EmbeddedCode, Files, Tfds, FineWeb, Warc)


def _first_record_problem(path: str, text_field: str) -> str:
    """Why the first record of the jsonl file `path` shows its text is not at `text_field`, or "" when it is
    there, or when that line is not a JSON object or cannot be read (the run counts or names that)."""
    try:
        with storage.open(path, "rb", compression="infer") as f:
            line, raw = next(((n, r) for n, r in enumerate(f, 1) if r.strip()), (0, b""))
        record = formats.parse_json(raw.decode("utf-8-sig")) if line else None   # -sig: a byte-order mark
    except (OSError, EOFError, zlib.error, ValueError, RecursionError):
        return ""
    if not isinstance(record, dict) or field(record, text_field) is not MISSING:
        return ""
    return (f"download.Files.text_field={text_field!r}: the first record of {path} (line {line}) has no "
            f"field {text_field!r}; its fields are {', '.join(map(repr, record)) or 'none'} (set "
            "download.Files.text_field to the one holding the text, e.g. \"metadata.text\" for a nested one)")


def _holds_a_record(path: str) -> bool:
    """Whether the file at `path` holds a record: a parquet footer's rows, else a non-blank line."""
    if formats.file_format(path) == "parquet":
        import pyarrow.parquet as pq

        with storage.open(path, "rb") as f:
            return pq.read_metadata(f).num_rows > 0
    with storage.open(path, "rb", compression="infer") as f:
        return any(line.strip() for line in f)


def _matching(found, what: str, hint: str = ""):
    """`found` (a glob's matches), or a ValueError naming the glob that matched nothing."""
    if not found:
        raise ValueError(f"{what} matches no files{hint}")
    return found


def _globs(name: str, paths, example: str) -> tuple[str, ...]:
    """`paths` as a tuple of globs (gin gives a list), or an error naming the field."""
    if isinstance(paths, str):
        raise TypeError(f"{name}={paths!r} is one string; expected a list of globs: [{paths!r}]")
    if not paths:
        raise ValueError(f"{name} is empty; set it to a list of local or Cloud Storage globs, e.g. {example}")
    return tuple(_home(name, p) for p in paths)


def _home(name: str, path) -> str:
    """A local `path` with "~/x" or "~user/x" expanded to that home directory, as a shell (and
    pipeline.Settings.cache_root) would: left alone, the glob looks for a directory named "~" and matches
    nothing while the files exist. A `~user` with no home directory is refused."""
    if not (isinstance(path, str) and path.startswith("~") and storage.is_local(path)):
        return path
    home = os.path.expanduser(path)
    if home.startswith("~"):
        raise ValueError(f"{name}: {path!r}: no such user's home directory to expand {path.split('/')[0]!r} "
                         "to; name the directory in full")
    return home


def _fingerprint(what: str, patterns: tuple[str, ...], example: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for pattern in patterns:
        versions = storage.versions(pattern)            # regular files only
        if not versions and (dirs := storage.glob(pattern)):     # what it matched is directories
            one = "a directory" if dirs == [pattern] else f"only directories ({', '.join(dirs[:3])})"
            raise ValueError(f"{what}: {pattern!r} is {one}; name the files in it, e.g. "
                             f"{storage.join(dirs[0], example)!r}")
        found.update(_matching(versions, f"{what}: {pattern!r}"))
    return dict(sorted(found.items()))


def _metadata_fields(owner: str, fields) -> tuple[str, ...]:
    """`metadata_fields` as a tuple: ("*",) alone, or field paths; an error naming the field otherwise."""
    fields = (fields,) if isinstance(fields, str) else tuple(fields)
    if not all(isinstance(f, str) and f for f in fields) or (formats.ALL in fields and len(fields) > 1):
        raise ValueError(f"{owner}.metadata_fields={fields!r} must be (\"*\",) for every other field, () "
                         'for none, or field paths such as ("date", "metadata.source")')
    return fields


def _check_at_least(name: str, value: object, low: int) -> None:
    # Only int values are checked: a value of the wrong type is left for the gin loader to report.
    if isinstance(value, int) and value < low:
        raise ValueError(f"{name}={value!r} must be >= {low}")
