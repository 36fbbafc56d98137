"""Gin at the edge: gin files + overrides -> a `Plan` of frozen stage Configs and their cache keys.

    plan = config.load(["gin/tiny.gin"], ["tokenizer.Config.vocab_size = 3000"])
    plan.stages["tokenizer"].key     # sha256 of (name, VERSION, config, upstream keys[, inputs])

Gin names: every stage's `Config` is `<stage>.Config` (so `clean.Config.min_chars = 100`), other
configurable dataclasses a stage lists in `CONFIGURABLES` are `<stage>.<Class>`
(`download.Files.paths = [...]`), the Beam runner is `beam_runner.Runner`, and run-wide
settings are `pipeline.Settings` (`pipeline.Settings.cache_root = "gs://bucket/refinery"`).

Everything that can be wrong with a config fails here, before any stage runs, as one ConfigError line:
a gin file that is missing, not text, or leaves a bracket open (naming the file and line), an include
that is not found (naming the including file and line and where includes are looked up) or that
includes itself, a syntax error (naming the file and line, or the override), unknown configurables or
parameters (with the valid names), `%gin.REQUIRED` values and macros left unset, values of the wrong
type, and values a Config's own validation rejects. (What needs the cache root or the machine, whether
it can be reached and written, whether the training mesh fits the devices, `python -m pipeline` checks
next: pipeline/__main__.py.)
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import difflib
import functools
import glob
import io
import logging
import os
import re
import tokenize
import types
import typing
from collections.abc import Iterable
from typing import Any

import gin
from pipeline import cache, dag
from stages import beam_runner
from stages.io import storage

GIN_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "gin")


@dataclasses.dataclass(frozen=True)
class Settings:
    """Run-wide settings that are not part of any stage's key."""

    cache_root: str = "cache"   # a local path (relative to the working directory) or gs://bucket/prefix

    def __post_init__(self):
        if not self.cache_root.strip():     # "" would put the cache in the working directory itself
            raise ValueError('cache_root is empty; name a local directory ("cache") or a bucket prefix')


@dataclasses.dataclass(frozen=True)
class StagePlan:
    """One stage of a plan: its config, and its cache key, computed when first asked for.

    A stage whose module defines `key_inputs(config)` (download) lists what it reads from outside the
    cache for its key, which can take a listing call or the network; configs, placeholders and the train
    plan need no key, so `make plan` works offline and loading a config stays cheap.
    """

    name: str
    config: Any
    version: str
    upstream_plans: tuple[StagePlan, ...] = dataclasses.field(default=(), repr=False, compare=False)

    @property
    def upstream(self) -> tuple[str, ...]:
        return tuple(u.name for u in self.upstream_plans)

    @functools.cached_property
    def key(self) -> str:
        """sha256 of (name, VERSION, config, upstream keys, inputs); InputsError when the inputs cannot be
        listed, here or upstream."""
        return cache.stage_key(self.name, self.version, self.config,
                               {u.name: u.key for u in self.upstream_plans}, self.inputs)

    @property
    def inputs(self) -> Any:
        """What the stage reads from outside the cache (`key_inputs(config)`), or None for a stage that
        reads only its upstream stages."""
        value, error = self._inputs
        if error is not None:
            raise error
        return value

    @functools.cached_property
    def _inputs(self) -> tuple[Any, InputsError | None]:
        # The failure is kept too: every downstream key asks again, and listing again (offline: waiting
        # for the network again) would only repeat it.
        key_inputs = getattr(dag.module(self.name), "key_inputs", None)
        if key_inputs is None:
            return None, None
        try:
            return key_inputs(self.config), None
        except Exception as e:  # noqa: BLE001 - whatever stops the listing, the key is unknown: say why
            error = InputsError(f"{self.name}: cannot list what it reads, so its cache key and every key "
                                f"after it are unknown: {type(e).__name__}: {e}")
            error.__cause__ = e
            return None, error


@dataclasses.dataclass(frozen=True)
class Plan:
    cache_root: str
    stages: dict[str, StagePlan]   # in DAG order
    operative_gin: str             # the operative config, saved next to each stage's output
    gin_files: tuple[str, ...]
    gin_params: tuple[str, ...]


PLACEHOLDER = "YOUR_"      # how a shipped config marks a value the user must fill in (gin/600b.gin)


class ConfigError(ValueError):
    """A gin file or override that cannot produce valid stage configs; the message says why."""


class InputsError(ValueError):
    """A stage's inputs cannot be listed (offline, a glob that matches nothing), so its key is unknown."""


# What gin raises for a file or binding it cannot take (OSError: a file it cannot open).
GIN_ERRORS = (ValueError, KeyError, SyntaxError, ImportError, OSError, tokenize.TokenError)


# ---------------------------------------------------------------------------------------------

def load(gin_files: Iterable[str], gin_params: Iterable[str] = ()) -> Plan:
    gin_files, gin_params = tuple(gin_files), tuple(p for p in gin_params if p.strip())
    registry = _register()
    gin.clear_config()
    for path in gin_files:
        if not os.path.exists(path):
            raise ConfigError(f"gin file {path!r} does not exist (looked relative to {os.getcwd()})")
        if not os.path.isfile(path):
            raise ConfigError(f"gin file {path!r} is a directory; name a .gin file in it")
    if GIN_DIR not in gin.config._LOCATION_PREFIXES:
        gin.add_config_file_search_path(GIN_DIR)
    _check_sources(gin_files)
    # Files, then each override on its own (what parse_config_files_and_bindings does, less the joining of
    # the overrides into one text), so that an error names the override it is in.
    with _quiet_include_search():
        for path in gin_files:
            try:
                gin.parse_config_file(path)
            except GIN_ERRORS as e:
                raise ConfigError(_explain(e, registry, _where(gin_files, gin_params))) from None
        for binding in gin_params:
            _check_text(binding, f"override {binding!r}")
            try:
                gin.parse_config(binding)
            except GIN_ERRORS as e:
                raise ConfigError(f"override {binding!r}: {_explain(e, registry, '')}{_no_equals(binding)}") \
                    from None

    settings = _build("pipeline.Settings", registry, gin_files, gin_params)
    stages: dict[str, StagePlan] = {}
    for name in dag.STAGES:
        module = dag.module(name)
        config = _build(f"{name}.Config", registry, gin_files, gin_params)
        stages[name] = StagePlan(name, config, module.VERSION, tuple(stages[u] for u in dag.upstream(name)))
    cache_root = storage.absolute(settings.cache_root)   # a relative local path is relative to the cwd
    return Plan(cache_root, stages, gin.operative_config_str(), gin_files, gin_params)


def placeholders(plan: Plan) -> list[str]:
    """The bindings whose resolved value still holds a `YOUR_...` placeholder, as `name = value` lines.

    A config may say which of its fields its other settings make irrelevant (`unused_fields()`: the TPU
    slice of a launcher that runs in process, the Dataflow project of a local Beam runner); those are
    not asked for.
    """
    registry = _register()
    names = {cls: name for name, cls in registry.items()}
    found: dict[str, None] = {}          # ordered and without repeats: a shared binding is listed once

    def walk(value, where: str):
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            owner = names.get(type(value), where)
            unused = value.unused_fields() if hasattr(value, "unused_fields") else ()
            for f in dataclasses.fields(value):
                if f.name not in unused:
                    walk(getattr(value, f.name), f"{owner}.{f.name}")
        elif isinstance(value, (list, tuple)):
            for v in value:
                walk(v, where)
        elif isinstance(value, str) and PLACEHOLDER in value:
            found[f"{where} = {value!r}"] = None

    walk(Settings(plan.cache_root), "pipeline.Settings")
    for stage in plan.stages.values():
        walk(stage.config, f"{stage.name}.Config")
    return list(found)


class _quiet_include_search(contextlib.AbstractContextManager):
    """Gin looks for `include 'model/tiny.gin'` relative to the working directory before gin/, and logs
    every miss on the root logger as an ERROR ("Path not found"); a miss followed by a hit is no error."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = str(record.msg)
        return not msg.startswith(("Path not found", "system_path_file_exists"))

    def __enter__(self):
        logging.getLogger().addFilter(self)
        return self

    def __exit__(self, *exc):
        logging.getLogger().removeFilter(self)


def _register() -> dict[str, type]:
    """Registers every configurable dataclass with gin once; returns gin name -> original class.

    Gin constructs a *shadow* subclass whose `__post_init__` does nothing, so a Config's own
    validation never sees unchecked values (a string where it compares numbers); `_plain` then
    type-checks every field and builds the real class, which validates itself.
    """
    registry = {"pipeline.Settings": Settings, "beam_runner.Runner": beam_runner.Runner}
    for name in dag.STAGES:
        for cls in getattr(dag.module(name), "CONFIGURABLES", ()):
            registry[f"{name}.{cls.__name__}"] = cls
    for gin_name, cls in registry.items():
        module, _, short = gin_name.rpartition(".")
        if not _is_registered(gin_name):
            shadow = type(cls.__name__, (cls,), {"__post_init__": lambda self: None,
                                                 "__module__": cls.__module__})
            gin.external_configurable(shadow, name=short, module=module)
    return registry


def _is_registered(gin_name: str) -> bool:
    try:
        gin.get_configurable(gin_name)
        return True
    except ValueError:
        return False


def _build(gin_name: str, registry: dict[str, type], files: tuple, params: tuple) -> Any:
    """Calls the gin-wrapped class, then rebuilds plain dataclasses with checked, converted values."""
    try:
        obj = gin.get_configurable(gin_name)()
    except (ValueError, TypeError) as e:
        raise ConfigError(_explain(e, registry, _where(files, params))) from None
    try:
        return _plain(obj, gin_name, registry)
    except ConfigError as e:
        raise ConfigError(f"{e}{_where(files, params)}") from None


def _plain(obj: Any, where: str, registry: dict[str, type]) -> Any:
    """Turns gin's wrapper subclasses back into the registered (picklable) classes, recursively,
    converting lists to tuples and checking every field against its annotation."""
    if not (dataclasses.is_dataclass(obj) and not isinstance(obj, type)):
        return obj
    cls = next(c for c in type(obj).__mro__ if c in registry.values())
    hints = typing.get_type_hints(cls)
    values = {}
    for f in dataclasses.fields(cls):
        binding = f"{where}.{f.name}"
        value = getattr(obj, f.name)
        if value is gin.REQUIRED or type(value).__name__ == "_GinRequired":
            raise ConfigError(f"{binding} is %gin.REQUIRED but no gin file or override sets it")
        if type(value) in registry.values():
            # A nested config left at its dataclass default was built without gin; build it through
            # gin so `train.ModelConfig.d_model = 768` applies without also binding
            # `train.Config.model = @train.ModelConfig()`.
            value = gin.get_configurable(_gin_name(value, registry))()
        values[f.name] = _check(_plain(value, _gin_name(value, registry) or binding, registry),
                                hints[f.name], binding)
    try:
        return cls(**values)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"{where}: {e}") from None


def _gin_name(value: Any, registry: dict[str, type]) -> str | None:
    for name, cls in registry.items():
        if isinstance(value, cls):
            return name
    return None


def _check(value: Any, hint: Any, binding: str) -> Any:
    """`value` converted to `hint` where that is lossless (list -> tuple, int -> float), else an error."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        for arm in args:
            try:
                return _check(value, arm, binding)
            except ConfigError:
                continue
        raise _type_error(value, hint, binding)
    if hint is type(None):
        if value is None:
            return value
        raise _type_error(value, hint, binding)
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise _type_error(value, hint, binding)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_check(v, args[0], f"{binding}[{i}]") for i, v in enumerate(value))
        if args and len(args) != len(value):
            raise _type_error(value, hint, binding)
        return tuple(_check(v, a, f"{binding}[{i}]") for i, (v, a) in enumerate(zip(args, value))) \
            if args else tuple(value)
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint is int and isinstance(value, bool):
        raise _type_error(value, hint, binding)
    if isinstance(hint, type) and not isinstance(value, hint):
        raise _type_error(value, hint, binding)
    return value


def _type_error(value: Any, hint: Any, binding: str) -> ConfigError:
    expected = getattr(hint, "__name__", None) or str(hint).replace("typing.", "")
    extra = ""
    if isinstance(value, str) is False and "str" in str(hint) and not isinstance(value, (int, float)):
        extra = ' (strings need quotes in gin: name = "value")'
    return ConfigError(f"{binding} = {value!r} has type {type(value).__name__}; expected {expected}{extra}")


def _explain(e: Exception, registry: dict[str, type], where: str) -> str:
    """Gin's error in one line, plus the names that would have been valid. Gin appends where it was (each
    include on the way, innermost first) as indented lines; they become the line's prefix, and `where`
    (which files and overrides were read) is added only when gin named no file."""
    if isinstance(e, SyntaxError):       # gin's own: the file and line are attributes, not text
        msg = _explain_message(str(e.msg).strip(), registry).rstrip(".")
        if not e.filename:               # an override, which the caller names
            return msg
        text = f" (`{e.text.strip()}`)" if e.text and e.text.strip() else ""
        return f"{e.filename} line {e.lineno}: {msg}{text}"
    if isinstance(e, tokenize.TokenError):
        return f"{e.args[0]}{where}"
    text = str(e).strip()
    first = _LOCATION.search(text)
    msg = _explain_message(text[:first.start()] if first else text, registry)
    files = [(name, line, code.strip()) for name, line, code in _LOCATION.findall(text) if name]
    if not files:
        return msg + where
    (name, line, code), outer = files[0], files[1:]
    included = "".join(f"; included from {n} line {ln}" for n, ln, _ in outer)
    return f"{name} line {line}: {msg} (`{code}`){included}"


# How gin appends a location to an error: '\n  In file "F", line N\n    <line>[\n    ^]' or '\n  In bindings
# string line N\n    <line>'.
_LOCATION = re.compile(r'\n  In (?:file "([^"]*)",|bindings string) line (\d+)\n    ([^\n]*)(?:\n *\^)?')


def _explain_message(msg: str, registry: dict[str, type]) -> str:
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


def _no_equals(binding: str) -> str:
    """A hint for an override that is not a binding at all."""
    return "" if "=" in binding else "; an override is NAME=VALUE (e.g. train.Config.steps=100)"


def _check_sources(gin_files: tuple[str, ...]) -> None:
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
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except UnicodeDecodeError as e:
            raise ConfigError(f"gin file {path} is not UTF-8 text (byte {e.start}: {e.reason})") from None
        except OSError as e:
            raise ConfigError(f"cannot read gin file {path}: {e.strerror or e}") from None
        includes, problem = _scan(text)
        for line, name in includes:       # gin reads an include where it stands, before the rest of the file
            found = _find_include(name)
            if found is None:
                raise ConfigError(f"{path} line {line}: include {name!r} not found; includes are looked up "
                                  f"relative to the working directory ({os.getcwd()}), then in the gin/ "
                                  f"directory ({GIN_DIR}){_similar_gin_files(name)}")
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


def _check_text(text: str, where: str) -> None:
    """ConfigError when gin text (an override) leaves a bracket or a triple-quoted string open: gin would
    read the next override into it, or raise tokenize.TokenError naming nothing."""
    _, problem = _scan(text)
    if problem:
        raise ConfigError(f"{where}: {problem.removeprefix('line 1: ')}")


def _scan(text: str) -> tuple[list[tuple[int, str]], str]:
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


def _find_include(name: str) -> str | None:
    """The file gin reads for `include name`: an absolute path as it is, else the first of the working
    directory and the search paths (gin/) that holds it."""
    prefixes = [""] if os.path.isabs(name) else gin.config._LOCATION_PREFIXES
    return next((os.path.join(p, name) for p in prefixes if os.path.isfile(os.path.join(p, name))), None)


def _similar_gin_files(name: str) -> str:
    """A hint naming the files under gin/ close to `name` (". Did you mean 'model/tiny.gin'?"), or ""."""
    found = glob.glob(os.path.join(GIN_DIR, "**", "*.gin"), recursive=True)
    known = [os.path.relpath(p, GIN_DIR) for p in found]
    close = difflib.get_close_matches(name, known, n=2, cutoff=0.8)
    return f". Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""


def _where(files: tuple, params: tuple) -> str:
    return f" (gin files: {', '.join(files) or 'none'}; overrides: {'; '.join(params) or 'none'})"
