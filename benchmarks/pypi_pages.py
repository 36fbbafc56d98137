"""FineWeb-like rows from real web text shipped with the repository: benchmarks/data/pypi_pages.jsonl.gz.

    .venv/bin/python -m benchmarks.pypi_pages        # rebuilds the file from the installed packages
    pypi_pages.rows()                                # [{"id", "text", "url"}] from the shipped file

Each row is a part of a Python package's project page as pypi.org shows it (the package's own
description, written by its authors), made the way FineWeb made its rows: the Markdown rendered to
HTML inside a page with navigation, a sidebar and a footer, then its main text extracted with
trafilatura as datatrove's extractor runs it (`stages.download.warc.extractor("trafilatura")`).
Only packages whose license is Apache-2.0 alone (Refinery's license) and whose description is
Markdown are used; long descriptions are cut at their second-level headings into pages of at least
`PAGE_CHARS` characters. benchmarks/data/README.md lists the packages, versions and licenses.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import sys

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
PATH = os.path.join(DATA, "pypi_pages.jsonl.gz")
PAGE_CHARS = 1500
APACHE = ("apache-2.0", "apache 2.0", "apache license, version 2.0", "apache license 2.0")
TEMPLATE = """<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{name} · PyPI</title></head>
<body><header><nav><a href="/">PyPI</a> <a href="/help/">Help</a> <a href="/sponsors/">Sponsors</a>
<a href="/account/login/">Log in</a> <a href="/account/register/">Register</a></nav></header>
<main><h1>{name} {version}</h1><p><code>pip install {name}</code></p>
<aside><h3>Navigation</h3><ul><li><a href="#description">Project description</a></li>
<li><a href="#history">Release history</a></li><li><a href="#files">Download files</a></li></ul>
<h3>Meta</h3><p>License: {license}</p></aside>
<article id="description"><h2>Project description</h2>{body}</article></main>
<footer><p>Help: Installing packages, Uploading packages, User guide.</p>
<p>About PyPI: PyPI Blog, Infrastructure dashboard, Statistics.</p></footer></body></html>
"""


def rows() -> list[dict]:
    """The shipped rows (id, text, url), text as trafilatura gave it."""
    with gzip.open(PATH, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def build() -> tuple[list[dict], list[tuple[str, str, str]]]:
    """(rows, [(package, version, license)]) from the packages installed here."""
    from importlib import metadata

    from markdown_it import MarkdownIt

    from stages.download import warc

    render = MarkdownIt("commonmark").enable("table")
    out, used = [], []
    for dist in sorted(metadata.distributions(), key=lambda d: d.metadata["Name"].lower()):
        meta = dist.metadata
        name, version = meta["Name"], meta["Version"]
        license_ = (meta.get("License-Expression") or meta.get("License") or "").strip()
        body = meta.get_payload() or meta.get("Description") or ""
        if (license_.lower() not in APACHE or name.lower() == "refinery" or len(body) < 800
                or "markdown" not in (meta.get("Description-Content-Type") or "")):
            continue
        for i, part in enumerate(_pages(body)):
            html = TEMPLATE.format(name=name, version=version, license=license_, body=render.render(part))
            text = warc.extractor("trafilatura")(html)
            if text:
                out.append({"id": f"pypi/{name}/{version}#{i}", "text": text,
                            "url": f"https://pypi.org/project/{name}/{version}/"})
        used.append((name, version, license_))
    return out, used


def _pages(markdown: str) -> list[str]:
    """`markdown` cut before its `## ` headings into pages of at least PAGE_CHARS characters."""
    pages, current = [], ""
    for section in re.split(r"(?m)^(?=## )", markdown):
        current += section
        if len(current) >= PAGE_CHARS:
            pages.append(current)
            current = ""
    if current.strip():
        if pages and len(current) < PAGE_CHARS // 2:
            pages[-1] += current
        else:
            pages.append(current)
    return pages


def main() -> int:
    out, used = build()
    os.makedirs(DATA, exist_ok=True)
    with gzip.GzipFile(PATH, "wb", mtime=0) as f:          # the same bytes on every build
        for row in out:
            f.write((json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8"))
    chars = sum(len(r["text"]) for r in out)
    print(f"{PATH}: {len(out)} pages from {len(used)} packages, {chars:,} characters")
    for name, version, license_ in used:
        print(f"| {name} | {version} | {license_} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
