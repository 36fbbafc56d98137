"""What gin has parsed, read from gin's private module state: `state()` here is the only code in Refinery that
touches a private name of gin.

    found = gin_internals.state()
    found.bindings          # {(scope, selector): {parameter: value}}, e.g. ("code", "clean.Config"): {...}
    found.search_paths      # where gin looks a config file up, in order ("" first: as given)

Why: gin has no public way to list what it parsed (`query_parameter` answers for a name one already knows,
`config_str()` is text), nor to ask where it looks files up. pipeline/config.py needs the bindings to refuse a
gin scope nothing reads (`cdoe/clean.Config.min_chars = 100` would otherwise clean a source `code` with the
defaults, silently) and to tell whether a source has bindings of its own; and the search paths to add gin/
once (`gin.add_config_file_search_path` appends a path on every call, and every plan calls it).

What it relies on (gin-config 0.5.0): `gin.config._CONFIG`, a dict {(scope, selector): {parameter: value}}
holding every binding parsed since `gin.clear_config()` (scope "" when unscoped, "a/b" when nested; selector
the configurable's full name), and `gin.config._LOCATION_PREFIXES`, the list of path prefixes that
`add_config_file_search_path` appends to. `state()` checks both shapes on every call and raises a
RuntimeError naming the installed gin version and what is missing or changed, so an upgrade that breaks them
fails loudly (tests/pipeline/test_gin_internals.py runs it on a real parse) instead of letting every scope
through.

(Not a private name, but gin's behaviour all the same: pipeline/gin_errors.py swaps
`gin.config.parse_config_file`, which gin looks up for every `include`, while it parses; the include cases
of tests/pipeline/test_bad_config.py fail if gin stops doing so.)
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
from typing import Any

import gin


@dataclasses.dataclass(frozen=True)
class GinState:
    """A copy of what gin holds: changing it changes nothing in gin."""

    bindings: dict[tuple[str, str], dict[str, Any]]      # {(scope, selector): {parameter: value}}
    search_paths: tuple[str, ...]


def state() -> GinState:
    """What gin has parsed since its config was last cleared, and where it looks gin files up; RuntimeError
    naming the gin version and the attribute when gin no longer keeps them as this module relies on."""
    bindings = _private("_CONFIG", dict, "a dict {(scope, selector): {parameter: value}}")
    for key, params in bindings.items():
        if not (isinstance(key, tuple) and len(key) == 2 and all(isinstance(k, str) for k in key)
                and isinstance(params, dict)):
            raise _changed(f"gin.config._CONFIG holds {key!r}: {type(params).__name__}, not "
                           "(scope, selector): {parameter: value}")
    paths = _private("_LOCATION_PREFIXES", list, "a list of path prefixes")
    if not all(isinstance(p, str) for p in paths):
        raise _changed(f"gin.config._LOCATION_PREFIXES = {paths!r} is not a list of path prefixes")
    return GinState({key: dict(params) for key, params in bindings.items()}, tuple(paths))


def _private(name: str, kind: type, shape: str) -> Any:
    value = getattr(gin.config, name, None)
    if value is None:
        raise _changed(f"gin.config has no {name} ({shape})")
    if not isinstance(value, kind):
        raise _changed(f"gin.config.{name} is a {type(value).__name__}, not {shape}")
    return value


def _changed(what: str) -> RuntimeError:
    return RuntimeError(f"gin-config {gin_version()}: {what}. pipeline/gin_internals.py reads gin's private "
                        "state as gin-config 0.5.0 keeps it (its docstring says what and why); adapt state() "
                        "to this version or install gin-config==0.5.0")


def gin_version() -> str:
    try:
        return importlib.metadata.version("gin-config")
    except importlib.metadata.PackageNotFoundError:
        return "(version unknown)"
