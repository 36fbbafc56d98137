"""Reading gin source, and gin's errors in one line that names the file, the line and what would be valid.

    gin_errors.check_sources(["gin/tiny.gin"])  # ConfigError: a missing include, an include cycle...
    gin_errors.explain(error, registry, where)   # gin's exception -> "F line N: unknown configurable ..."

`pipeline/config.py` (`load`) reads gin through these: it checks every file and its includes before gin
parses them (gin names neither the file of a missing include nor where a bracket opened, and recurses
until RecursionError on an include cycle), and turns what gin raises into a `ConfigError`.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import difflib
import glob
import io
import os
import re
import tokenize
from collections.abc import Callable, Iterator

import gin

GIN_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "gin")


class ConfigError(ValueError):
    """A gin file or override that cannot produce valid stage configs; the message says why."""


# What gin raises for a file or binding it cannot take (OSError: a file it cannot open).
GIN_ERRORS = (ValueError, KeyError, SyntaxError, ImportError, OSError, tokenize.TokenError)


@contextlib.contextmanager
def includes_beside_their_files() -> Iterator[Callable[[str], object]]:
    """While it lasts, gin reads each `include` from the file `find_include` names for the file that holds
    it, and skips a UTF-8 byte-order mark at the start of every file. Yields `read(path)`, which parses one
    gin file (a run's own, as given) that way.

    Gin itself looks an include up relative to the working directory first, then on its search paths, and
    tries each place with every registered reader, including one that reads `data/embedded.gin` as the
    file `embedded.gin` of a Python package `data`: a folder named data, model or recipe where the run
    starts made every shipped gin file fail with a TypeError. Gin passes an include's name and not the
    file it is in, so its own lookup (`gin.config.parse_config_file`, which gin calls for every include)
    is replaced for the duration."""
    original = gin.config.parse_config_file
    reading: list[str | None] = [None]           # the file being parsed; None: an override

    def read(path: str, skip_unknown=False) -> object:
        reading.append(path)
        try:
            with open(path, encoding="utf-8-sig") as f:     # -sig: a byte-order mark is not gin
                includes, imports = gin.config.parse_config(f, skip_unknown=skip_unknown)
        finally:
            reading.pop()
        return gin.config.ParsedConfigFileIncludesAndImports(path, imports, includes)

    def include(name: str, skip_unknown=False, print_includes_and_imports=False) -> object:
        found = find_include(name, reading[-1])
        if found is None:
            raise OSError(f"include {name!r} not found; includes are {looked_up(reading[-1])}"
                          f"{similar_gin_files(name)}")
        return read(found, skip_unknown)

    gin.config.parse_config_file = include
    try:
        yield read
    finally:
        gin.config.parse_config_file = original


def explain(e: Exception, registry: dict[str, type], where: str) -> str:
    """Gin's error in one line, plus the names that would have been valid. Gin appends where it was (each
    include on the way, innermost first) as indented lines; they become the line's prefix, and `where`
    (which files and overrides were read) is added only when gin named no file."""
    if isinstance(e, SyntaxError):       # gin's own: the file and line are attributes, not text
        msg = explain_message(str(e.msg).strip(), registry).rstrip(".")
        if not e.filename:               # an override, which the caller names
            return msg
        text = f" (`{e.text.strip()}`)" if e.text and e.text.strip() else ""
        return f"{e.filename} line {e.lineno}: {msg}{text}"
    if isinstance(e, tokenize.TokenError):
        return f"{e.args[0]}{where}"
    text = str(e).strip()
    first = _LOCATION.search(text)
    msg = explain_message(text[:first.start()] if first else text, registry)
    files = [(name, line, code.strip()) for name, line, code in _LOCATION.findall(text) if name]
    if not files:
        return msg + where
    (name, line, code), outer = files[0], files[1:]
    included = "".join(f"; included from {n} line {ln}" for n, ln, _ in outer)
    return f"{name} line {line}: {msg} (`{code}`){included}"


# How gin appends a location to an error: '\n  In file "F", line N\n    <line>[\n    ^]' or '\n  In bindings
# string line N\n    <line>'.
_LOCATION = re.compile(r'\n  In (?:file "([^"]*)",|bindings string) line (\d+)\n    ([^\n]*)(?:\n *\^)?')


def explain_message(msg: str, registry: dict[str, type]) -> str:
    """One of gin's messages (without its location) in words that name what would be valid."""
    msg = " ".join(msg.split())
    m = re.search(r"No configurable matching (?:reference )?'@?([^'(]+)(?:\(\))?'", msg)
    if m:
        bad = m.group(1)
        close = difflib.get_close_matches(bad, registry, n=3, cutoff=0.5)
        hint = f" Did you mean {' or '.join(close)}?" if close else ""
        names = ", ".join(sorted(registry))
        return f"unknown configurable {bad!r}.{hint} Configurables are: {names}."
    m = re.search(r"Configurable '([^']+)' doesn't have a parameter named '([^']+)'", msg)
    if m:
        owner, param = m.groups()
        cls = next((c for n, c in registry.items() if n.endswith("." + owner) or n == owner), None)
        if cls is not None:
            valid = [f.name for f in dataclasses.fields(cls)]
            close = difflib.get_close_matches(param, valid, n=3, cutoff=0.5)
            # The parameter may belong to a sibling config (train.Config.learning_rate is
            # train.OptimizerConfig.learning_rate): name it.
            stage = owner.split(".")[0]
            owners = [n for n, c in registry.items() if c is not cls and n.split(".")[0] == stage
                      and param in {f.name for f in dataclasses.fields(c)}]
            close += [f"{n}.{param}" for n in owners]
            hint = f" Did you mean {' or '.join(close)}?" if close else ""
            return f"{owner} has no parameter {param!r}.{hint} Its parameters are: {', '.join(valid)}."
    m = re.search(r"Failed to parse token '([^']*)'", msg)
    if m:
        return (f"cannot parse the gin value {m.group(1)!r}; strings need quotes "
                f"(name = \"{m.group(1)}\"), references an @ (name = @download.Files()).")
    m = re.search(r"In call to configurable 'macro' .* in scope '([^']+)'", msg)
    if m:      # gin turns %NAME into a call of its `macro` configurable in scope NAME
        return (f"macro %{m.group(1)} is used but never set; bind it in a gin file or override "
                f"({m.group(1)} = <value>) or use a value instead")
    return msg


def no_equals(binding: str) -> str:
    """A hint for an override that is not a binding at all."""
    return "" if "=" in binding else "; an override is NAME=VALUE (e.g. train.Config.steps=100)"


def check_sources(gin_files: tuple[str, ...]) -> None:
    """Reads each gin file and every file it includes, as gin will, and raises ConfigError naming the file
    and line of what gin reports without them: an include it cannot find (gin names the include only),
    an include cycle (gin recurses until RecursionError), a bracket or triple-quoted string left open
    (tokenize.TokenError: no file, no line), a file that is not UTF-8 text."""
    done: set[str] = set()

    def walk(path: str, chain: tuple[tuple[str, str], ...]):
        real = os.path.realpath(path)
        if real in done:
            return
        try:
            with open(path, encoding="utf-8-sig") as f:     # a byte-order mark at the start is skipped
                text = f.read()
        except UnicodeDecodeError as e:
            raise ConfigError(f"gin file {path} is not UTF-8 text (byte {e.start}: {e.reason})") from None
        except OSError as e:
            raise ConfigError(f"cannot read gin file {path}: {e.strerror or e}") from None
        includes, problem = scan(text)
        for line, name in includes:       # gin reads an include where it stands, before the rest of the file
            found = find_include(name, path)
            if found is None:
                raise ConfigError(f"{path} line {line}: include {name!r} not found; includes are "
                                  f"{looked_up(path)}{similar_gin_files(name)}")
            here = (*chain, (path, real))
            starts = [i for i, (_, r) in enumerate(here) if r == os.path.realpath(found)]
            if starts:
                cycle = " -> ".join([p for p, _ in here[starts[0]:]] + [found])
                raise ConfigError(f"{path} line {line}: include {name!r} makes an include cycle ({cycle}); "
                                  "remove one of the includes")
            walk(found, here)
        if problem:
            raise ConfigError(f"{path} {problem}")
        done.add(real)

    for path in gin_files:
        walk(path, ())


def check_text(text: str, where: str) -> None:
    """ConfigError when gin text (an override) leaves a bracket or a triple-quoted string open: gin would
    read the next override into it, or raise tokenize.TokenError naming nothing."""
    _, problem = scan(text)
    if problem:
        raise ConfigError(f"{where}: {problem.removeprefix('line 1: ')}")


def scan(text: str) -> tuple[list[tuple[int, str]], str]:
    """The `include '...'` statements of gin source `text` as (line, file), and "" or where and why it does
    not tokenize ("line 3: '(' is never closed"). Gin's parser reads Python tokens, so Python's tokenizer
    finds what it would choke on."""
    includes: list[tuple[int, str]] = []
    opened: list[tuple[str, int]] = []      # the brackets open at this point: (bracket, line)
    statement: list[tokenize.TokenInfo] = []   # the tokens so far of the statement being read
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type in (tokenize.NEWLINE, tokenize.NL) and not opened:
                statement = []
            elif tok.type not in (tokenize.COMMENT, tokenize.NL, tokenize.INDENT, tokenize.DEDENT):
                statement.append(tok)
                if tok.type == tokenize.OP and tok.string in "([{":
                    opened.append((tok.string, tok.start[0]))
                elif tok.type == tokenize.OP and tok.string in ")]}" and opened:
                    opened.pop()
                if (len(statement) == 2 and statement[0].string == "include"
                        and tok.type == tokenize.STRING):
                    with contextlib.suppress(ValueError, SyntaxError):
                        includes.append((statement[0].start[0], ast.literal_eval(tok.string)))
    except tokenize.TokenError as e:
        if "string" in e.args[0]:
            return includes, f"line {e.args[1][0]}: a triple-quoted string is never closed"
        if opened:
            return includes, f"line {opened[-1][1]}: {opened[-1][0]!r} is never closed"
        return includes, f"line {e.args[1][0]}: {e.args[0]}"
    return includes, ""


def repeated_key(gin_files: tuple[str, ...], params: tuple[str, ...], name: str) -> str:
    """Where a dict bound to `name` (`sweep.variants = {...}`) names a key twice, in a gin file, a file it
    includes or an override, as "F line N: name names 'k' twice (first on line M)...", or "". Gin, like
    Python, keeps the last value of a repeated key and drops the first without a word, so the source is
    read."""
    sources, seen = [], set()

    def walk(path: str) -> None:
        if os.path.realpath(path) in seen:
            return
        seen.add(os.path.realpath(path))
        with open(path, encoding="utf-8-sig") as f:
            text = f.read()
        for _, include in scan(text)[0]:
            if (found := find_include(include, path)) is not None:
                walk(found)
        sources.append((path, text))

    for path in gin_files:
        walk(path)
    sources += [(f"override {p!r}", p) for p in params]
    for where, text in sources:
        for line, value in _bound_values(text, name):
            try:
                tree = ast.parse(value, mode="eval").body
            except SyntaxError:
                continue
            if not isinstance(tree, ast.Dict):
                continue
            first: dict = {}
            for key in tree.keys:
                try:
                    k = ast.literal_eval(key) if key is not None else None
                except ValueError:
                    continue
                at = line + key.lineno - 1 if key is not None else line
                if k in first:
                    before = f" (first on line {first[k]})" if first[k] != at else ""
                    return (f"{where} line {at}: {name} names {k!r} twice{before}; gin would keep the last "
                            "and drop the first without a word: give each entry its own name")
                first[k] = at
    return ""


def _bound_values(text: str, name: str) -> list[tuple[int, str]]:
    """(line, source of the value) of every `name = value` statement in gin source `text`."""
    lines = text.splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))
    out, statement, depth = [], [], 0

    def take():
        names = [t.string for t in statement]
        if "=" in names:
            eq = names.index("=")
            if "".join(names[:eq]) == name and eq + 1 < len(statement):
                (r0, c0), (r1, c1) = statement[eq + 1].start, statement[-1].end
                out.append((r0, text[starts[r0 - 1] + c0:starts[r1 - 1] + c1]))

    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type in (tokenize.NEWLINE, tokenize.NL, tokenize.ENDMARKER) and depth == 0:
                if statement:
                    take()
                statement = []
            elif tok.type not in (tokenize.COMMENT, tokenize.NL, tokenize.INDENT, tokenize.DEDENT):
                statement.append(tok)
                depth += tok.string in "([{" if tok.type == tokenize.OP else 0
                depth -= tok.string in ")]}" if tok.type == tokenize.OP else 0
    except tokenize.TokenError:     # an unclosed bracket: gin has reported it before this is asked
        pass
    return out


def find_include(name: str, including: str | None = None) -> str | None:
    """The file `include name` in the gin file `including` (None: an override) reads, or None: an absolute
    path as it is, else the first of `include_dirs(including)` that holds it. The working directory plays
    no part, so what it holds cannot change what a gin file means."""
    dirs = [""] if os.path.isabs(name) else include_dirs(including)
    return next((os.path.join(d, name) for d in dirs if os.path.isfile(os.path.join(d, name))), None)


def include_dirs(including: str | None) -> list[str]:
    """Where a relative include is looked up, in order: the directory of the file that holds it, then the
    repository's gin/. A file under gin/ (every shipped one: gin/twins/600b.gin includes '600b.gin', the
    run it is the twin of) writes its includes relative to gin/ alone; an override has no directory."""
    if including is None:
        return [GIN_DIR]
    here = os.path.dirname(os.path.abspath(including))
    if os.path.realpath(here) == os.path.realpath(GIN_DIR) or \
            os.path.realpath(here).startswith(os.path.realpath(GIN_DIR) + os.sep):
        return [GIN_DIR]
    return [here, GIN_DIR]


def looked_up(including: str | None) -> str:
    """How an include of `including` is looked up, for an error ("looked up relative to ... then in ...")."""
    dirs = include_dirs(including)
    if len(dirs) == 1:
        return f"looked up in the gin/ directory ({GIN_DIR})"
    return f"looked up relative to the including file ({dirs[0]}), then in the gin/ directory ({GIN_DIR})"


def similar_gin_files(name: str) -> str:
    """A hint naming the files under gin/ close to `name` (". Did you mean 'model/tiny.gin'?"), or ""."""
    found = glob.glob(os.path.join(GIN_DIR, "**", "*.gin"), recursive=True)
    known = [os.path.relpath(p, GIN_DIR) for p in found]
    close = difflib.get_close_matches(name, known, n=2, cutoff=0.8)
    return f". Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""


def where(files: tuple, params: tuple) -> str:
    return f" (gin files: {', '.join(files) or 'none'}; overrides: {'; '.join(params) or 'none'})"
