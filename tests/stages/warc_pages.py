"""WARC and WET files that look like a Common Crawl segment, for tests and the commoncrawl twin.

    .venv/bin/python -m tests.stages.warc_pages cache/commoncrawl-twin   (gin/twins/commoncrawl.gin reads it)

Pages are English prose (the paragraphs of Python's own pydoc help topics, so nothing is downloaded)
inside real-looking HTML: navigation, a sidebar, a cookie banner, a footer, scripts and styles around an
<article>. Each page gets its own paragraphs, so pages are not near-duplicates of each other unless a
test makes them so. Records come as a crawler writes them (request, response, metadata), with stable
record ids and dates, so the files are the same on every run.
"""

from __future__ import annotations

import functools
import io
import random
import re
import sys
import uuid
from pathlib import Path

from warcio.statusandheaders import StatusAndHeaders
from warcio.warcwriter import WARCWriter

DATE = "2024-03-01T12:00:00Z"
TEMPLATE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="{charset}"><title>{title} | Example Docs</title>
<style>body {{ font-family: sans-serif; }} nav a {{ margin: 0 4px; }}</style>
<script>window.dataLayer = window.dataLayer || []; function gtag() {{ dataLayer.push(arguments); }}</script>
</head><body>
<div class="cookie-banner">This site uses cookies to improve your experience.
<a href="/privacy">Privacy policy</a></div>
<nav><a href="/">Home</a> | <a href="/docs">Docs</a> | <a href="/blog">Blog</a>
| <a href="/about">About us</a>
| <a href="/contact">Contact</a> | <a href="/login">Log in</a></nav>
<div class="layout"><aside><h3>Related</h3><ul><li><a href="/p/1">Popular posts</a></li>
<li><a href="/p/2">Latest news</a></li><li><a href="/p/3">Subscribe to our newsletter</a></li></ul></aside>
<main><article><h1>{title}</h1><p class="byline">Posted by the documentation team</p>
{body}
</article></main></div>
<footer><p>Copyright 2024 Example Docs. All rights reserved.</p><a href="/terms">Terms of use</a>
<a href="/privacy">Privacy</a></footer>
<script src="/static/app.js"></script>
<script>document.querySelectorAll("a").forEach(function (a) {{ a.rel = "noopener"; }});</script>
</body></html>
"""


@functools.lru_cache
def prose_paragraphs(docstrings: bool = False) -> tuple[str, ...]:
    """Prose paragraphs (several sentences, no code) from pydoc's help topics (~160), and with
    `docstrings` also from the standard library's docstrings (~650 in all; a few seconds to parse)."""
    from pydoc_data.topics import topics

    from stages.download import embedded

    texts = [topics[name] for name in sorted(topics)]
    if docstrings:
        units = embedded.units(0, include_topics=False)
        texts += [d["text"] or "" for unit in units for d in embedded.read(unit)]
    out = []
    for block in (b for t in texts for b in re.split(r"\n\s*\n", t)):
        text = " ".join(block.split())
        if (len(text) > 300 and text.endswith(".") and text.count(". ") >= 2 and "{" not in text
                and ">>>" not in text and not text.startswith(("*", "-", "+")) and _wordy(text)):
            out.append(text)
    return tuple(dict.fromkeys(out))


def _wordy(text: str) -> bool:
    """Few quotes and brackets: most tokens are words, as Gopher's quality filter wants of prose
    (at least 80% of words with a letter; punctuation counts as words there)."""
    tokens = re.findall(r"\w+|[^\w\s]", text)
    return sum(any(c.isalpha() for c in t) for t in tokens) >= 0.82 * len(tokens)


def page_html(title: str, paragraphs: list[str], charset: str = "utf-8") -> str:
    body = "\n".join(f"<p>{_escape(p)}</p>" for p in paragraphs)
    return TEMPLATE.format(title=_escape(title), body=body, charset=charset)


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def pages(count: int, per_page: int = 3, seed: int = 0) -> list[tuple[str, str, list[str]]]:
    """(url, title, paragraphs) for `count` pages; no paragraph is on two pages (up to ~80 pages: then
    the prose runs out and pages cycle through it again)."""
    paragraphs = list(prose_paragraphs())
    if count * per_page > len(paragraphs):
        paragraphs = list(prose_paragraphs(docstrings=True))
    random.Random(seed).shuffle(paragraphs)
    out = []
    for i in range(count):
        chosen = [paragraphs[(i * per_page + j) % len(paragraphs)] for j in range(per_page)]
        title = " ".join(chosen[0].split()[:6]).rstrip(".,;:")
        out.append((f"https://docs.example.com/{seed}/page-{i}.html", title, chosen))
    return out


class Writer:
    """A WARC file being written: `response`, `request`, `metadata`, `conversion` records."""

    def __init__(self, path: str | Path, gzip: bool = True):
        self.file = open(path, "wb")  # noqa: SIM115 - closed by close()
        self.writer = WARCWriter(self.file, gzip=gzip)
        info = self.writer.create_warcinfo_record(Path(path).name, {"software": "refinery tests"})
        self.writer.write_record(info)

    def _headers(self, url: str, kind: str, extra: dict | None = None) -> dict:
        rid = f"<urn:uuid:{uuid.uuid5(uuid.NAMESPACE_URL, kind + ' ' + url)}>"
        return {"WARC-Record-ID": rid, "WARC-Date": DATE, **(extra or {})}

    def response(self, url: str, body: bytes, content_type: str | None = "text/html; charset=utf-8",
                 identified: str | None = None, http_extra: tuple = ()) -> str:
        headers = [("Content-Type", content_type)] if content_type else []
        http = StatusAndHeaders("200 OK", headers + list(http_extra), protocol="HTTP/1.1")
        extra = {"WARC-Identified-Payload-Type": identified} if identified else {}
        warc_headers = self._headers(url, "response", extra)
        self.writer.write_record(self.writer.create_warc_record(
            url, "response", payload=io.BytesIO(body), http_headers=http, warc_headers_dict=warc_headers))
        return warc_headers["WARC-Record-ID"]

    def request(self, url: str) -> None:
        http = StatusAndHeaders(f"GET {url.split('/', 3)[-1]} HTTP/1.1", [("Host", "docs.example.com")],
                                is_http_request=True)
        self.writer.write_record(self.writer.create_warc_record(
            url, "request", payload=io.BytesIO(b""), http_headers=http,
            warc_headers_dict=self._headers(url, "request")))

    def metadata(self, url: str) -> None:
        self.writer.write_record(self.writer.create_warc_record(
            url, "metadata", payload=io.BytesIO(b"fetchTimeMs: 120\r\n"),
            warc_content_type="application/warc-fields",
            warc_headers_dict=self._headers(url, "metadata")))

    def conversion(self, url: str, text: bytes) -> str:
        warc_headers = self._headers(url, "conversion")
        self.writer.write_record(self.writer.create_warc_record(
            url, "conversion", payload=io.BytesIO(text), warc_content_type="text/plain",
            warc_headers_dict=warc_headers))
        return warc_headers["WARC-Record-ID"]

    def page(self, url: str, html: str, charset: str = "utf-8") -> str:
        """A page as a crawler writes it: request, response, metadata."""
        self.request(url)
        rid = self.response(url, html.encode(charset), f"text/html; charset={charset}",
                            identified="text/html")
        self.metadata(url)
        return rid

    def close(self) -> None:
        self.file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def crawl(directory: str | Path, count: int = 70, wet: int = 8, files: int = 2, seed: int = 0) -> list[str]:
    """A small crawl: `files` .warc.gz files of `count` prose pages in all (request, response, metadata
    each), an exact copy and a near copy of one page, some records that give no text (an image, a PDF, a
    binary body labelled HTML, a page of links only), and a .warc.wet.gz of `wet` more pages' text."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    all_pages = pages(count + wet, seed=seed)
    wet_pages, all_pages = all_pages[count:], all_pages[:count]
    paths = []
    for f in range(files):
        path = directory / f"CC-TEST-{seed}-{f:05d}.warc.gz"
        with Writer(path) as w:
            for url, title, paragraphs in all_pages[f::files]:
                w.page(url, page_html(title, paragraphs))
            if f == 0:
                url, title, paragraphs = all_pages[0]
                w.page(url.replace(".html", "-copy.html"), page_html(title, paragraphs))
                w.page(url.replace(".html", "-near.html"),
                       page_html(title, paragraphs[:-1] + [paragraphs[-1] + " This page was updated."]))
                w.response("https://docs.example.com/logo.png", b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4,
                           "image/png", identified="image/png")
                w.response("https://docs.example.com/manual.pdf", b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n1 0 obj",
                           "application/pdf", identified="application/pdf")
                w.response("https://docs.example.com/mislabelled", bytes(range(256)) * 8, "text/html")
                links = "".join(f'<li><a href="/t/{i}">Tag {i}</a></li>' for i in range(40))
                w.response("https://docs.example.com/tags",
                           f"<html><body><ul>{links}</ul></body></html>".encode())
        paths.append(str(path))
    path = directory / f"CC-TEST-{seed}-00000.warc.wet.gz"
    with Writer(path) as w:
        for url, title, paragraphs in wet_pages:
            w.conversion(url, "\n".join([title, *paragraphs]).encode("utf-8"))
    paths.append(str(path))
    return paths


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m tests.stages.warc_pages DIRECTORY")
    for p in crawl(sys.argv[1]):
        print(p)
