"""Gin at the edge: gin files + overrides -> a `Plan` (pipeline/plan.py) of frozen stage Configs.

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
type, and values a Config's own validation rejects. Reading the gin source and wording gin's errors is
pipeline/gin_errors.py; checking each value against its field's type is pipeline/typecheck.py. What
needs the cache root, the machine or the inputs (whether they can be reached and written, whether the
training mesh fits the devices) is checked next, by pipeline/checks.py.
"""

from __future__ import annotations

import dataclasses
import json
import os
import typing
from collections.abc import Iterable
from typing import Any

import gin
from pipeline import cache, dag, gin_errors, gin_internals, search_bindings, typecheck
from pipeline.gin_errors import GIN_DIR, ConfigError
from pipeline.plan import InputsError, Plan, StagePlan
from stages import beam_runner
from stages.io import storage

# What `load` returns and raises, importable from here as well as from their own modules.
__all__ = ["GIN_DIR", "PLACEHOLDER", "ConfigError", "InputsError", "Plan", "Settings", "StagePlan", "key_gin",
           "load", "load_settings", "placeholders"]


@dataclasses.dataclass(frozen=True)
class Settings:
    """Run-wide settings that are not part of any stage's key."""

    # A local path (relative to the working directory; "~/x" and "~user/x" are expanded to that home
    # directory, as a shell would) or gs://bucket/prefix.
    cache_root: str = "cache"

    def __post_init__(self):
        if not self.cache_root.strip():     # "" would put the cache in the working directory itself
            raise ValueError('cache_root is empty; name a local directory ("cache") or a bucket prefix')
        if storage.is_local(self.cache_root) and self.cache_root.startswith("~"):
            # Nothing else expands it: left alone, "~/x" is a directory named "~" in the working directory.
            home = os.path.expanduser(self.cache_root)
            if home.startswith("~"):
                raise ValueError(f"cache_root={self.cache_root!r}: no such user's home directory to expand "
                                 f"{self.cache_root.split('/')[0]!r} to; name the directory in full")
            object.__setattr__(self, "cache_root", home)


PLACEHOLDER = "YOUR_"      # how a shipped config marks a value the user must fill in (gin/600b.gin)


# ---------------------------------------------------------------------------------------------

def load(gin_files: Iterable[str], gin_params: Iterable[str] = ()) -> Plan:
    """The plan the gin files and overrides (later ones win) describe; ConfigError, in one line, when they
    cannot make one."""
    gin_files, gin_params = tuple(gin_files), tuple(p for p in gin_params if p.strip())
    registry = _register()
    gin.clear_config()
    for path in gin_files:
        if not os.path.exists(path):
            raise ConfigError(f"gin file {path!r} does not exist (looked relative to {os.getcwd()})")
        if not os.path.isfile(path):
            raise ConfigError(f"gin file {path!r} is a directory; name a .gin file in it")
    if GIN_DIR not in gin_internals.state().search_paths:
        gin.add_config_file_search_path(GIN_DIR)
    gin_errors.check_sources(gin_files)
    # Files, then each override on its own (what parse_config_files_and_bindings does, less the joining of
    # the overrides into one text), so that an error names the override it is in.
    with gin_errors.includes_beside_their_files() as read:
        for path in gin_files:
            try:
                read(path)
            except gin_errors.GIN_ERRORS as e:
                raise ConfigError(gin_errors.explain(e, registry, gin_errors.where(gin_files, gin_params))) \
                    from None
        for binding in gin_params:
            gin_errors.check_text(binding, f"override {binding!r}")
            try:
                gin.parse_config(binding)
            except gin_errors.GIN_ERRORS as e:
                why = gin_errors.explain(e, registry, "")
                raise ConfigError(f"override {binding!r}: {why}{gin_errors.no_equals(binding)}") from None

    settings = _build("pipeline.Settings", registry, gin_files, gin_params)
    built = {name: _build(f"{name}.Config", registry, gin_files, gin_params) for name in dag.STAGES}
    sources = _sources(built)
    reference = _selects_by_reference(built, sources, registry, gin_files, gin_params)
    tree = dag.tree(sources, reference=reference)
    if problem := _stray_scope(tree.sources + ((dag.REFERENCE,) if reference else ())):
        raise ConfigError(problem)
    stages: dict[str, StagePlan] = {}
    for node, (name, ups) in tree.nodes.items():
        module = dag.module(name)
        config, seen = built[name], built
        if source := dag.source_of(node):        # a source's own stage: its gin scope's bindings apply
            with gin.config_scope(source):
                config = _build(f"{name}.Config", registry, gin_files, gin_params)
                # the reference run's stages all follow its scope; a source's, its own stages
                seen = built | {s: _build(f"{s}.Config", registry, gin_files, gin_params)
                                for s in (dag.STAGES if source == dag.REFERENCE else dag.PER_SOURCE)}
        if source == dag.REFERENCE and name == "clean" and config.keep_top and config.keep_top.score == "bpb":
            # the ranking by the reference model is the main run's: the reference's own data has none
            config = dataclasses.replace(config, keep_top=None)
        # fields one binding of another stage sets: clean's contamination check follows
        # yardsticks.Config.tasks, score measures what the source's own clean.Config decides on
        if follow := getattr(module, "follow", None):
            config = follow(config, seen)
        if resolve := getattr(module, "resolve", None):      # a config completed from outside (init_from)
            try:
                config = resolve(config, _bound(name, module))
            except (OSError, ValueError) as e:
                raise ConfigError(f"{node}: {e}") from None
        if source == dag.REFERENCE and getattr(config, "mixture", None) is not None:
            raise ConfigError(f"{node}: the reference model trains on its one source (reference/download"
                              ".Config.source), not the run's mixture: set "
                              "reference/train.Config.mixture = None")
        configs = {s: stages[s].config for s in tree.closure(node) if s != node} | {node: config}
        stages[node] = StagePlan(node, config, module.VERSION, tuple(stages[u] for u in ups),
                                 config_gin=key_gin(node, configs, registry),
                                 input_names=tree.input_names(node))
    if problem := _one_source_twice(stages, tree.sources):
        raise ConfigError(problem)
    cache_root = storage.absolute(settings.cache_root)   # a relative local path is relative to the cwd
    return Plan(cache_root, stages, gin.operative_config_str(), gin_files, gin_params, tree)


def load_settings(gin_name: str, gin_files: Iterable[str],
                  gin_params: Iterable[str] = ()) -> tuple[Any, Plan]:
    """(the settings of a command that runs many plans, the plan of its base run): `gin_name` is "sweep" or
    "mixsearch" (search_bindings.CONFIGURABLES), built from the same gin files and overrides as `load`'s
    plan, the way a stage's Config is (each value checked against its field's type, then the class's own
    validation). ConfigError, in one line naming the binding, what is valid and the gin files, otherwise.

        found, plan = config.load_settings("sweep", ["gin/sweeps/lr.gin"])     # found.seeds, found.bindings()
    """
    if gin_name not in search_bindings.CONFIGURABLES:
        raise ValueError(f"no settings named {gin_name!r}; they are: "
                         f"{', '.join(search_bindings.CONFIGURABLES)}")
    gin_files, gin_params = tuple(gin_files), tuple(p for p in gin_params if p.strip())
    plan = load(gin_files, gin_params)          # parses the files: their bindings stand until the next load
    return _build(gin_name, _register(), gin_files, gin_params), plan


def _stray_scope(sources: tuple[str, ...]) -> str:
    """A binding in a gin scope that nothing reads, in one line, or "": its scope is neither a source of the
    run (`code/clean.Config...`) nor named by a reference (`@c4_val/download.Files()`). gin would ignore it
    silently; a misspelled source (`cdoe/clean.Config.min_chars`) would then clean with the defaults."""
    bindings = gin_internals.state().bindings       # {(scope, selector): {parameter: value}}
    # the scopes of every @scope/name reference, and the name of every %macro (gin's reference to its
    # `macro` configurable in a scope named after the macro)
    referenced = {s for ref in gin.config.iterate_references(bindings) for s in ref.scopes}
    for (scope, selector), params in bindings.items():
        top = scope.split("/")[0] if scope else ""
        if top and top not in sources and top not in referenced:
            name = f"{scope}/{selector}.{next(iter(params), '')}"
            known = f"its sources are {', '.join(sources)}" if sources else "it has one source and no scopes"
            why = (f"; the reference model's run (scope {dag.REFERENCE!r}) is part of a run only when a "
                   "clean.KeepTop ranks by its bits per byte (clean.KeepTop.score = 'bpb')"
                   if top == dag.REFERENCE else "")
            return (f"{name} is bound in gin scope {top!r}, which no stage reads: {top!r} is not a source of "
                    f"this run ({known}; train.Mixture names them) and no @{top}/... reference uses it{why}")
    return ""


def _one_source_twice(stages: dict[str, StagePlan], sources: tuple[str, ...]) -> str:
    """Two sources of a mixture that are one, in one line, or "": every stage of their chains (download,
    clean, shard: dag.PER_SOURCE) has the same config, so the chains hold the same data under one key (`web`
    weighed beside `prose` with no `web/...` binding of its own inherits the unscoped bindings, prose's).
    Training would draw both weights from one corpus while the report named two."""
    seen: dict[str, str] = {}
    for source in sources:
        nodes = [dag.node_name(stage, source) for stage in dag.PER_SOURCE]     # those in the tree
        data = json.dumps([cache.config_to_json(stages[n].config, for_key=True)
                           for n in nodes if n in stages], sort_keys=True)
        if (first := seen.setdefault(data, source)) == source:
            continue
        unbound = [s for s in (first, source) if not _has_scope(s)]
        name = unbound[-1] if unbound else source
        why = (f"{' and '.join(map(repr, unbound))} {'has' if len(unbound) == 1 else 'have'} no gin binding "
               "of its own, so the unscoped bindings apply") if unbound else \
            "their scoped bindings change nothing that selects documents"
        return (f"train.Mixture weighs sources {first!r} and {source!r}, which are one source: their "
                f"{', '.join(s for s in dag.PER_SOURCE if dag.node_name(s, source) in stages)} configs are "
                f"identical ({why}), so the model would read the "
                f"same documents under both names. Give {name!r} its own data (e.g. "
                f"{name}/download.Config.source = ...), or weigh one name")
    return ""


def _has_scope(source: str) -> bool:
    """Whether any gin binding is made in `source`'s scope (`code/clean.Config...`)."""
    return any(scope.split("/")[0] == source for scope, _ in gin_internals.state().bindings)


def _sources(built: dict[str, Any]) -> tuple[str, ...]:
    """The run's sources, sorted: those a stage's config names (its module's optional
    `named_sources(config)`: the
    training mixture's), or none (one source)."""
    found = set()
    for name, config in built.items():
        if fn := getattr(dag.module(name), "named_sources", None):
            found.update(fn(config))
    return tuple(sorted(found))


def _selects_by_reference(built: dict[str, Any], sources: tuple[str, ...], registry: dict[str, type],
                          files: tuple, params: tuple) -> bool:
    """Whether some source's clean.Config keeps documents by the reference model's bits per byte
    (`clean.KeepTop.score = "bpb"`): then the run holds the reference model's run (dag.REFERENCE)."""
    if "clean" not in built:           # a DAG without the clean stage (tests' fake stages)
        return False
    cleans = [built["clean"]]
    for source in sources:
        with gin.config_scope(source):
            cleans.append(_build("clean.Config", registry, files, params))
    return any(c.keep_top is not None and c.keep_top.score == "bpb" for c in cleans)


def _bound(stage: str, module) -> frozenset[str]:
    """The "<Class>.<field>" names of `stage`'s configurables that the parsed gin config binds."""
    out = set()
    for cls in getattr(module, "CONFIGURABLES", ()):
        for f in dataclasses.fields(cls):
            try:
                gin.query_parameter(f"{stage}.{cls.__name__}.{f.name}")
            except ValueError:
                continue
            out.add(f"{cls.__name__}.{f.name}")
    return frozenset(out)


def key_gin(stage: str, configs: dict[str, Any], registry: dict[str, type]) -> str:
    """The `config.gin` the cache writes next to `stage`'s output: the gin of what its key covers.

    `configs` maps `stage` and every stage it reads (`dag.closure`) to its resolved Config, in DAG order.
    Each field the key covers is bound to its resolved value (macros and defaults written out), and so is
    each field of a config nested in one (`download.Config.source = @download.Embedded()`, then
    `download.Embedded.max_files = 300`); key=False fields, the configs only they reach (the Beam runner,
    training's launcher and hardware) and `pipeline.Settings` are not written. The text is therefore a
    function of the key: two runs of one key, on any cache root and however they run, write the same
    bytes. It is gin a run reads: `python -m pipeline run --gin config.gin --stage <stage>` computes the
    same keys for `stage` and its upstream stages (fields it does not bind take their defaults).
    """
    names = {cls: name for name, cls in registry.items()}
    blocks: dict[str, list[str]] = {}       # gin name (scoped where needed) -> its `field = value` lines

    def render(value: Any, where: str, scope: str = "") -> str:
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            kept = cache.config_to_json(value, for_key=True)      # the key's own rule for which fields count
            lines = [f"{f.name} = {render(getattr(value, f.name), f'{where}.{f.name}', scope)}"
                     for f in dataclasses.fields(value) if f.name in kept]
            name = f"{scope}/{names[type(value)]}" if scope else names[type(value)]
            if blocks.setdefault(name, lines) != lines:
                # The same class twice with different values: gin binds a class once, so this one is scoped
                # by where it sits (`download_Config_sources_1/download.Files.paths = ...`).
                name = f"{where.replace('.', '_')}/{name}"
                blocks[name] = lines
            return f"@{name}()"
        if isinstance(value, (list, tuple)):
            items = [render(v, f"{where}.{i}", scope) for i, v in enumerate(value)]
            return f"[{', '.join(items)}]" if isinstance(value, list) else \
                f"({', '.join(items)}{',' if len(items) == 1 else ''})"
        if isinstance(value, dict):
            return "{" + ", ".join(f"{k!r}: {render(v, where, scope)}" for k, v in value.items()) + "}"
        if value is None or isinstance(value, (bool, int, float, str)):
            return repr(value)
        raise TypeError(f"{where} = {value!r} of type {type(value).__name__} cannot be written as gin")

    for node, config in configs.items():         # a source's own stage (clean[code]) in its gin scope (code/)
        render(config, f"{dag.stage_of(node)}.Config", dag.source_of(node))
    header = (f"# The bindings the cache key of {stage} covers: the key fields of the configs of "
              f"{', '.join(configs)}, resolved.\n"
              f"#   python -m pipeline run --gin config.gin --stage {stage}\n")
    return header + "".join(f"\n# {name}\n" + "".join(f"{name}.{line}\n" for line in lines)
                            for name, lines in sorted(blocks.items(), key=_block_order))


def _block_order(block: tuple[str, list[str]]) -> tuple:
    """Stages in DAG order, each stage's Config first, then its nested configs by name."""
    name = block[0].rpartition("/")[2]
    stage, _, short = name.partition(".")
    stages = list(dag.STAGES)
    return (stages.index(stage) if stage in stages else len(stages), short != "Config", block[0])


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


def _register() -> dict[str, type]:
    """Registers every configurable dataclass with gin once; returns gin name -> original class.

    Gin constructs a *shadow* subclass whose `__post_init__` does nothing, so a Config's own
    validation never sees unchecked values (a string where it compares numbers); `_plain` then
    type-checks every field and builds the real class, which validates itself.
    """
    registry = {"pipeline.Settings": Settings, "beam_runner.Runner": beam_runner.Runner,
                **search_bindings.CONFIGURABLES}     # `sweep.seeds`: a gin name without a module
    for name in dag.STAGES:
        for cls in getattr(dag.module(name), "CONFIGURABLES", ()):
            registry[f"{name}.{cls.__name__}"] = cls
    for gin_name, cls in registry.items():
        module, _, short = gin_name.rpartition(".")
        if not _is_registered(gin_name):
            shadow = type(cls.__name__, (cls,), {"__post_init__": lambda self: None,
                                                 "__module__": cls.__module__})
            gin.external_configurable(shadow, name=short, module=module or None)
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
        raise ConfigError(gin_errors.explain(e, registry, gin_errors.where(files, params))) from None
    try:
        return _plain(obj, gin_name, registry)
    except ConfigError as e:
        raise ConfigError(f"{e}{gin_errors.where(files, params)}") from None


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
        values[f.name] = typecheck.check(_plain_value(value, binding, registry), hints[f.name], binding)
    try:
        return cls(**values)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"{where}: {e}") from None


def _plain_value(value: Any, binding: str, registry: dict[str, type]) -> Any:
    """`_plain` of a field's value, and of the configs inside a dict or list one holds
    (`yardsticks.Config.reference_files = {"c4": @c4/download.Files()}`)."""
    if isinstance(value, dict):
        return {k: _plain_value(v, f"{binding}[{k!r}]", registry) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_plain_value(v, f"{binding}[{i}]", registry) for i, v in enumerate(value))
    return _plain(value, _gin_name(value, registry) or binding, registry)


def _gin_name(value: Any, registry: dict[str, type]) -> str | None:
    for name, cls in registry.items():
        if isinstance(value, cls):
            return name
    return None
