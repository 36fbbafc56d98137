"""FineWeb's URL filter for the clean stage: block-listed domains and URLs, and banned words in the URL.

    URLFilter().check({"url": "https://free-porn.example.com/x", "text": ...}) == "url_banned_word"
    URLFilter(blocked_domain_files=("domains.txt",)).check(doc)              # lists named in gin

Rules, in datatrove's order (`URLFilter`, datatrove 0.10.1, which FineWeb runs with its defaults), each
with its reason (datatrove's in brackets):
    url_domain          the URL's host or a domain it belongs to is in a domain list   (domain, subdomain)
    url_listed          the URL is in a URL list                                      (url)
    url_banned_word     a banned word is one of the URL's words                       (hard_blacklisted)
    url_soft_words      at least `soft_word_threshold` soft words are among them      (soft_blacklisted)
    url_banned_subword  a banned subword occurs in the URL stripped to letters and digits
                                                                                      (blacklisted_subword)
A URL's words are its runs of ASCII letters and digits, lowercased. A document without a URL is kept
(datatrove fails on one).

The word lists default to datatrove's, shipped in stages/clean/data/ (see its README for their origin
and license); `builtin_words=False` leaves only the files named in gin. datatrove's domain and URL
lists (124 MB) are not shipped: the domain and URL rules are off until gin names list files. Each file
is local or remote (`stages.io.storage`), plain or `.gz`, one entry a line, `#` starting a comment; a
missing file fails the first document with its binding (`clean.URLFilter.<field>`) and the path. The
lists load once per worker process on first use, never into the dataclass (Beam pickles filters):
4.5 M domains take about 0.5 GB of memory per process.

Deliberate differences from datatrove 0.10.1:
- Domains: the host and every domain above it are looked up (`a.b.example.com`: itself, `b.example.com`,
  `example.com`, `com`), with no public-suffix list; datatrove looks up the host and its registered
  domain (tldextract), so it keeps `a.b.example.com` when only `b.example.com` is listed.
- URLs are also looked up without their scheme and a trailing `/` (`example.com/page`), the form the
  entries of datatrove's own URL list have; datatrove compares the whole URL, which never matches them.
- A URL stored without its scheme (`example.com/page`, as in Dolma's `metadata.url`) has its host
  looked up too (datatrove: tldextract, which also parses it); a local `path:line` has no host.
- URL words are lowercased, as the lists are; datatrove compares them as written, so `/PORN/` passes it.
- List entries that are empty once normalized are ignored; in datatrove an empty banned word matches
  every URL that ends in `/`.
"""

from __future__ import annotations

import dataclasses
import functools
import gzip
import importlib.resources
import re
from urllib.parse import urlsplit

from stages.io import storage

_NOT_WORD = re.compile(r"[^a-z0-9]+")
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
# A URL stored without its scheme (Dolma's `metadata.url`: `example.com/page`, `//example.com/page`): a
# dotted host name whose last label starts with a letter (or an IPv4 address), an optional port, then
# a path, query, fragment or the end. A local file's `data/x.jsonl:12` or `x.jsonl:12` is not one.
_BARE_HOST = re.compile(r"(?://)?(?:(?:[\w-]+\.)+[^\W\d_][\w-]*\.?|\d{1,3}(?:\.\d{1,3}){3})"
                        r"(?::\d+(?=[/?#])|(?=[/?#]|$))")
# The builtin word lists (stages/clean/data/), by the URLFilter field they add to.
BUILTIN_WORDS = {"banned_word_files": "banned_words.txt", "banned_subword_files": "banned_subwords.txt",
                 "soft_word_files": "soft_banned_words.txt"}


@dataclasses.dataclass(frozen=True)
class URLFilter:
    soft_word_threshold: int = 2                  # soft words that drop a URL; 0 is off
    builtin_words: bool = True                    # add datatrove's word lists (stages/clean/data/)
    blocked_domain_files: tuple[str, ...] = ()    # paths of lists, one entry a line
    blocked_url_files: tuple[str, ...] = ()
    banned_word_files: tuple[str, ...] = ()
    banned_subword_files: tuple[str, ...] = ()
    soft_word_files: tuple[str, ...] = ()

    def __post_init__(self):
        if not isinstance(self.soft_word_threshold, int) or self.soft_word_threshold < 0:
            raise ValueError(f"soft_word_threshold={self.soft_word_threshold!r} must be an int >= 0 "
                             "(0 turns the rule off)")
        for name in ("blocked_domain_files", "blocked_url_files", *BUILTIN_WORDS):
            paths = getattr(self, name)
            paths = (paths,) if isinstance(paths, str) else tuple(paths)   # gin may give a list or one path
            if not all(isinstance(p, str) and p for p in paths):
                raise ValueError(f"{name}={getattr(self, name)!r} must be paths of list files, e.g. "
                                 '["/data/blocklists/domains"]')
            object.__setattr__(self, name, paths)

    def reasons(self) -> tuple[str, ...]:
        return ("url_domain", "url_listed", "url_banned_word", "url_soft_words", "url_banned_subword")

    def check(self, doc: dict) -> str | None:
        url = doc.get("url")
        if not url or not isinstance(url, str):
            return None
        lists = _lists(self)
        if lists.domains:
            host = _host(url)
            if host and any(domain in lists.domains for domain in _domains_of(host)):
                return "url_domain"
        if lists.urls and not lists.urls.isdisjoint(_url_forms(url)):
            return "url_listed"
        lowered = url.lower()
        url_words = set(_NOT_WORD.split(lowered))
        if not lists.banned_words.isdisjoint(url_words):
            return "url_banned_word"
        if self.soft_word_threshold and len(lists.soft_words & url_words) >= self.soft_word_threshold:
            return "url_soft_words"
        squeezed = _NOT_WORD.sub("", lowered)
        if any(map(squeezed.__contains__, lists.banned_subwords)):
            return "url_banned_subword"
        return None


@dataclasses.dataclass(frozen=True)
class _Lists:
    domains: frozenset[str]
    urls: frozenset[str]
    banned_words: frozenset[str]
    banned_subwords: tuple[str, ...]
    soft_words: frozenset[str]


@functools.lru_cache(maxsize=4)
def _lists(f: URLFilter) -> _Lists:
    """The lists of one URLFilter, read once per process."""
    def words(field: str) -> set[str]:
        entries = _read(field, getattr(f, field))
        if f.builtin_words:
            entries += _entries(importlib.resources.files(__package__).joinpath(
                "data", BUILTIN_WORDS[field]).read_text("utf-8"))
        return {w for w in (_NOT_WORD.sub("", e.lower()) for e in entries) if w}

    return _Lists(domains=frozenset(e.lower().rstrip(".") for e in _read("blocked_domain_files",
                                                                         f.blocked_domain_files)),
                  urls=frozenset(_read("blocked_url_files", f.blocked_url_files)),
                  banned_words=frozenset(words("banned_word_files")),
                  banned_subwords=tuple(sorted(words("banned_subword_files"))),
                  soft_words=frozenset(words("soft_word_files")))


def _read(field: str, paths: tuple[str, ...]) -> list[str]:
    out: list[str] = []
    for path in paths:
        try:
            data = storage.read_bytes(path)
        except FileNotFoundError:
            raise FileNotFoundError(f"clean.URLFilter.{field}: {path} does not exist; name list files, one "
                                    "entry a line ('#' starts a comment), plain or .gz") from None
        if path.endswith(".gz"):
            data = gzip.decompress(data)
        out += _entries(data.decode("utf-8", errors="replace"))
    return out


def _entries(text: str) -> list[str]:
    return [s for s in (line.strip() for line in text.splitlines()) if s and not s.startswith("#")]


def _host(url: str) -> str | None:
    if not _SCHEME.match(url):
        if not _BARE_HOST.match(url):
            return None     # a local file's `path:line`, or no URL at all
        url = "//" + url.removeprefix("//")     # urlsplit finds the host of `//example.com/page`
    try:
        host = urlsplit(url).hostname     # lowercased, without user, port or brackets
    except ValueError:                    # a malformed URL (an unclosed IPv6 bracket, a bad port)
        return None
    return host.rstrip(".") if host else None


def _domains_of(host: str) -> list[str]:
    """`a.b.com` -> [`a.b.com`, `b.com`, `com`]."""
    parts = host.split(".")
    return [".".join(parts[i:]) for i in range(len(parts))]


def _url_forms(url: str) -> set[str]:
    """The URL as written, and without its scheme, `www.` or a trailing `/` (block lists write
    `example.com/page`)."""
    bare = _SCHEME.sub("", url)
    forms = {url, bare, bare.rstrip("/")}
    return forms | {f.removeprefix("www.") for f in forms}
