"""The URL filter's domain list on URLs stored without a scheme (Dolma's `metadata.url`), and on a local
file's `path:line`, which has no host.

    .venv/bin/python -m pytest -q tests/stages/test_urls_without_scheme.py
"""

import pytest

from stages.clean import urls


@pytest.fixture
def blocked(tmp_path):
    (tmp_path / "domains").write_text("bad-site.com\nevil.example.org\n10.0.0.7\n")
    return urls.URLFilter(builtin_words=False, blocked_domain_files=(str(tmp_path / "domains"),))


@pytest.mark.parametrize("url", [
    "bad-site.com/page",                     # Dolma's form
    "bad-site.com",
    "www.Bad-Site.com/a/b?c=d#e",
    "bad-site.com.:8080/x",                  # a trailing dot and a port
    "//a.evil.example.org/page",             # protocol-relative
    "a.evil.example.org?q=1",
    "10.0.0.7/admin",
])
def test_a_url_without_scheme_has_its_domain_blocked(blocked, url):
    assert blocked.check({"url": url, "text": "x"}) == "url_domain"


@pytest.mark.parametrize("url", [
    "good-site.com/bad-site.com",            # the host is good-site.com
    "notbad-site.com/page",
    "data/bad-site.com:12",                  # a local file's path:line, not a URL
    "bad-site.com:12",                       # ... even when the file is named like a domain
    "crawl/bad-site.com.warc.gz@1234",
    "tfds:bad-site.com:train:3",
])
def test_what_is_not_that_host_is_kept(blocked, url):
    assert blocked.check({"url": url, "text": "x"}) is None
