"""PII masking for the clean stage: e-mail addresses and public IP addresses, as FineWeb masks them.

    PIIMasker().apply({"text": "Mail jane@corp.com from 8.8.8.8"})
        == (None, {"text": "Mail email@example.com from 188.8.131.52"})      # the replacements vary

A rewriter (filters.Rewriter) that never drops a document: `apply` returns it with every e-mail address
replaced by one of `email_replacements` and every IPv4 address that is public (`ipaddress`'s
`is_global`: not private, loopback, link-local, shared, reserved, documentation, ...) by one of
`ip_replacements`; with `public_ips_only=False`, every IPv4 address. The replacements are those of
datatrove 0.10.1's `PIIFormatter` (FineWeb's recipe, its defaults): `example.com/org` addresses, and
IPs datatrove generated at random that did not answer a ping when it chose them.

Order: FineWeb masks after MinHash deduplication; here it is the last step of `clean_document`, before
exact and MinHash deduplication (graph.py). So deduplication sees masked text: documents that differ
only in the addresses masked here can become exact duplicates (when their addresses map to the same
replacement) and are dropped as `duplicate`, and near-duplicate pairs differ in a few characters less.
Masking changes a handful of characters in the rare documents that hold an address, so at FineWeb's
thresholds (Jaccard ~0.75 of 5-word shingles) it moves very few documents across the line. The kept
documents whose e-mails or IPs were masked are counted in `stats.json`'s `rewritten` (`pii_email`,
`pii_ip`; `changes`).

Deliberate differences from datatrove 0.10.1:
- The replacement is chosen by a hash of the address (crc32), so the same address always becomes the
  same replacement, whichever worker sees it; datatrove takes the next one in turn from a counter that
  runs across documents, which depends on the order the documents arrive in.
- An IP address must stand alone: not inside a word or a longer dotted name (no ASCII letter, digit,
  `_` or `.` before it, none of those or a `.` and one of them after it). datatrove masks the first four
  parts of any longer dotted number (`1.2.3.4.5` -> `<ip>.5`, `1.2.3.456` -> `<ip>6`) and versions
  like `v2.0.0.1`; those are kept here. A sentence's final `.` after an address is fine.
- An address literal in an e-mail is an IPv4 address in brackets (`a@[192.0.2.1]`); datatrove's pattern
  also takes a truncated form of RFC 5322's general literal (`a@[1.2.3.x:]`).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re
import zlib

# An e-mail address: dot-separated atoms of the characters RFC 5322 allows unquoted, `@`, then a domain
# of at least two labels (letters, digits, inner hyphens) or an IPv4 address in brackets.
_ATOM = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+"
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|[01]?[0-9][0-9]?)"   # 0-255; ipaddress rejects leading zeros
_IPV4 = rf"{_OCTET}(?:\.{_OCTET}){{3}}"
EMAIL = re.compile(rf"\b{_ATOM}(?:\.{_ATOM})*@(?:(?:{_LABEL}\.)+{_LABEL}|\[{_IPV4}\])")
IPV4 = re.compile(rf"(?<![A-Za-z0-9_.]){_IPV4}(?![A-Za-z0-9_]|\.[A-Za-z0-9_])")
_HAS_IPV4 = re.compile(r"[0-9]\.[0-9]{1,3}\.[0-9]")   # a cheap test first: most texts have none

EMAIL_REPLACEMENTS = ("email@example.com", "firstname.lastname@example.org")
IP_REPLACEMENTS = ("22.214.171.124", "126.96.36.199", "188.8.131.52", "184.108.40.206", "220.127.116.11",
                   "18.104.22.168")


@dataclasses.dataclass(frozen=True)
class PIIMasker:
    emails: bool = True
    ips: bool = True
    public_ips_only: bool = True
    email_replacements: tuple[str, ...] = EMAIL_REPLACEMENTS
    ip_replacements: tuple[str, ...] = IP_REPLACEMENTS

    def __post_init__(self):
        for name in ("email_replacements", "ip_replacements"):
            value = getattr(self, name)
            value = (value,) if isinstance(value, str) else tuple(value)   # gin may give a list or one string
            if not value or not all(isinstance(v, str) for v in value):
                raise ValueError(f"{name}={getattr(self, name)!r} must be one or more strings, e.g. "
                                 f"{getattr(PIIMasker, name)!r}")
            object.__setattr__(self, name, value)

    def reasons(self) -> tuple[str, ...]:
        return ()

    def rewrites(self) -> tuple[str, ...]:
        return ("pii_email", "pii_ip")

    def check(self, doc: dict) -> str | None:
        return None

    def apply(self, doc: dict) -> tuple[None, dict]:
        text = self.mask(doc["text"])
        return None, (doc if text == doc["text"] else {**doc, "text": text})

    def changes(self, before: dict, after: dict) -> tuple[str, ...]:
        """Which of `rewrites()` `apply` made: e-mails are masked first, so masking them again tells
        the two apart (the stage asks only about the few documents whose text changed)."""
        emails_masked = self._mask_emails(before["text"])
        return tuple(kind for kind, changed in (("pii_email", emails_masked != before["text"]),
                                                ("pii_ip", emails_masked != after["text"])) if changed)

    def mask(self, text: str) -> str:
        """`text` with its e-mail and public IP addresses replaced."""
        return self._mask_ips(self._mask_emails(text))

    def _mask_emails(self, text: str) -> str:
        return EMAIL.sub(self._email, text) if self.emails and "@" in text else text

    def _mask_ips(self, text: str) -> str:
        return IPV4.sub(self._ip, text) if self.ips and _HAS_IPV4.search(text) else text

    def _email(self, match: re.Match) -> str:
        return _pick(self.email_replacements, match.group())

    def _ip(self, match: re.Match) -> str:
        address = match.group()
        try:
            public = ipaddress.IPv4Address(address).is_global
        except ValueError:      # a part with a leading zero (`010.1.1.1`): not read as an address
            return address
        return _pick(self.ip_replacements, address) if public or not self.public_ips_only else address


def _pick(replacements: tuple[str, ...], found: str) -> str:
    return replacements[zlib.crc32(found.encode("utf-8")) % len(replacements)]

