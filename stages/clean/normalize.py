"""Text normalization for the clean stage: pure functions from str to str.

    normalize("Cafe\\u0301  au lait \\r\\n\\r\\n\\r\\nnext\\x00 line ") == "Café au lait\\n\\nnext line"

`normalize` applies, in this order:
  1. line breaks to `\\n`: `\\r\\n`, `\\r`, and the other characters Python's `str.splitlines` breaks
     on that are not control codes we drop (`\\v`, `\\f`, NEL, U+2028, U+2029) -- they separate lines
     in the source, so deleting them would glue words together;
  2. control characters (Unicode category Cc) removed, except `\\n` and `\\t`;
  3. Unicode NFC (`e` + combining acute becomes `é`, so equal-looking texts compare equal). After step 2,
     because a control character between a letter and its accent blocks composing them, and removing it
     would leave a text that is not NFC (and whose duplicates dedup would miss);
  4. whitespace tidied: runs of 2+ spaces/tabs become one space, spaces and tabs at line ends go,
     3+ newlines become 2 (one blank line is kept: it separates paragraphs);
  5. the whole document stripped.
With every step on, the result is NFC and `normalize(normalize(x)) == normalize(x)`. Steps 2, 3 and 4 can
be switched off (`clean.Config.remove_control_chars`, `unicode_nfc`, `tidy_whitespace`). Every step is
one C-speed `unicodedata` or `re` pass, linear in the text, so a 10 MB document costs tens of milliseconds.
"""

from __future__ import annotations

import re
import unicodedata

_BREAK_CHARS = "\r\v\f\x85\u2028\u2029"
_LINE_BREAK = re.compile(f"\r\n?|[{_BREAK_CHARS}]")
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")   # Cc is U+0000-001F and U+007F-009F; keeps \t \n
_SPACE_RUN = re.compile("[ \t]{2,}")
_LINE_END_SPACE = re.compile("[ \t]+$", re.MULTILINE)
_BLANK_LINES = re.compile("\n{3,}")

# A regex pass costs ~10 ns a character even when nothing matches, while `in` and `isascii` scan at
# memory speed; so each step below first checks whether it has anything to do (most texts are clean).


def normalize(text: str, *, nfc: bool = True, control: bool = True, whitespace: bool = True) -> str:
    text = line_breaks(text)
    if control:
        text = remove_control_chars(text)
    if nfc:
        text = unicode_nfc(text)
    if whitespace:
        text = tidy_whitespace(text)
    return text.strip()


def unicode_nfc(text: str) -> str:
    return unicodedata.normalize("NFC", text)   # returns `text` itself after a quick check when already NFC


def line_breaks(text: str) -> str:
    if not any(c in text for c in _BREAK_CHARS):
        return text
    return _LINE_BREAK.sub("\n", text)


def remove_control_chars(text: str) -> str:
    return _CONTROL.sub("", text)


def tidy_whitespace(text: str) -> str:
    # Collapsing runs first leaves at most one space or tab before a line end, so the line-end
    # pattern never rescans a long run (no quadratic case on a line of a million spaces).
    if "  " in text or "\t" in text:
        text = _SPACE_RUN.sub(" ", text)
    if " \n" in text or "\t\n" in text or text.endswith((" ", "\t")):
        text = _LINE_END_SPACE.sub("", text)
    if "\n\n\n" in text:
        text = _BLANK_LINES.sub("\n\n", text)
    return text
