"""The docs stay true: README.md and docs/*.md held to the code they describe. Fast; runs no stage.

    PYTHONPATH=$PWD .venv/bin/python -m pytest -q tests/test_docs.py

- docs/ARCHITECTURE.md's layer diagram names every module of pipeline/ and stages/io/, and no module that is
  gone; so does stages/io/__init__.py's docstring.
- Its stage-contract table has a row for every name pipeline/ reads on a stage module, and each row names the
  stages that define it.
- Every command the pages show parses: `make <target> VAR=...` names a .PHONY target of the Makefile and
  variables its recipe reads, the gin files it names exist, and they load with its OVERRIDES
  (pipeline/config.py's `load`, which builds configs and runs nothing; a stage's `resolve`, which reads a
  checkpoint from outside the repository, is left out); `python -m <module> ...` names a module of this
  repository that runs as a program, with a subcommand and options it has.
- Every repository path the pages name exists (a Python file named alone, `loop.py`, somewhere in it), and
  every relative link resolves.

A failure names the page, the command or path, and what would make it true.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import glob
import importlib
import importlib.util
import os
import re
import shlex
import shutil
import types

import pytest

from pipeline import __main__ as cli
from pipeline import config, dag
from tests.conftest import REPO

PAGES = ["README.md"] + sorted(os.path.relpath(p, REPO)
                                for p in glob.glob(os.path.join(REPO, "docs", "*.md")))
ARCHITECTURE = os.path.join("docs", "ARCHITECTURE.md")
TINY = os.path.join("gin", "tiny.gin")
# Modules the pages run that are not this repository's (their own docs say what they take).
EXTERNAL = ("nltk.downloader",)
# Files a page names that the user writes, not the repository (an lm-eval task's Python beside its YAML).
USER_FILES = ("utils.py",)
# The top-level folders whose paths a page may name (a path elsewhere, such as cache/..., is the user's).
ROOTS = ("pipeline", "stages", "tests", "benchmarks", "gin", "docs")


def _read(*parts: str) -> str:
    with open(os.path.join(*parts), encoding="utf-8") as f:
        return f.read()


# ---------------------------------------------------------------------------------------------
# The module lists

def diagram_modules(architecture: str, layer: str) -> set[str]:
    """The modules the layer diagram of ARCHITECTURE's "Layers" section names under `layer` ("pipeline/" or
    "stages/io/"), from the line that starts with it to the next arrow (▼) or the diagram's end. A module
    named by its whole path (`pipeline/tracked.py` in io's list) is not the layer's own."""
    layers = architecture.split("\n## Layers\n", 1)[1].split("\n## ", 1)[0]
    lines = layers.split("```", 2)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(layer))
    block = []
    for line in lines[start:]:
        if line.strip().startswith("▼"):
            break
        block.append(line)
    return set(re.findall(r"(?<![\w/.])(\w+)\.py\b", "\n".join(block)))


def docstring_modules(init_source: str) -> set[str]:
    """The modules a package docstring lists, one a line as `    name   what it does`."""
    return set(re.findall(r"^    (\w+) ", ast.get_docstring(ast.parse(init_source)) or "", re.M))


def modules_in(root: str, folder: str) -> set[str]:
    return {name[:-3] for name in os.listdir(os.path.join(root, folder))
            if name.endswith(".py") and name != "__init__.py"}


def module_list_problems(root: str = REPO) -> list[str]:
    """Each module of pipeline/ or stages/io/ a list leaves out, and each module a list names that is gone."""
    architecture = _read(root, ARCHITECTURE)
    lists = [("pipeline", "docs/ARCHITECTURE.md's layer diagram (its pipeline/ list)",
              diagram_modules(architecture, "pipeline/")),
             ("stages/io", "docs/ARCHITECTURE.md's layer diagram (its stages/io/ list)",
              diagram_modules(architecture, "stages/io/")),
             ("stages/io", "stages/io/__init__.py's docstring",
              docstring_modules(_read(root, "stages", "io", "__init__.py")))]
    out = []
    for folder, where, named in lists:
        present = modules_in(root, folder)
        out += [f"{where} does not name {folder}/{m}.py: add a line saying what it does"
                for m in sorted(present - named)]
        out += [f"{where} names {folder}/{m}.py, which does not exist: remove it, or name the module that "
                "does its job now" for m in sorted(named - present)]
    return out


def test_the_module_lists_name_every_module_of_pipeline_and_io():
    assert not (problems := module_list_problems()), "\n".join(problems)


def _copy_of_the_lists(tmp_path) -> str:
    """A tree holding what `module_list_problems` reads: ARCHITECTURE, io's __init__, and a file for each
    module of pipeline/ and stages/io/."""
    root = str(tmp_path)
    for folder in ("pipeline", os.path.join("stages", "io"), "docs"):
        os.makedirs(os.path.join(root, folder))
    for folder in ("pipeline", os.path.join("stages", "io")):
        for name in modules_in(REPO, folder):
            open(os.path.join(root, folder, f"{name}.py"), "w").close()
    shutil.copy(os.path.join(REPO, ARCHITECTURE), os.path.join(root, ARCHITECTURE))
    shutil.copy(os.path.join(REPO, "stages", "io", "__init__.py"), os.path.join(root, "stages", "io"))
    return root


def test_a_module_added_without_its_line_is_named(tmp_path):
    root = _copy_of_the_lists(tmp_path)
    assert module_list_problems(root) == []
    open(os.path.join(root, "pipeline", "widgets.py"), "w").close()
    open(os.path.join(root, "stages", "io", "tokens.py"), "w").close()
    problems = module_list_problems(root)
    assert len(problems) == 3 and "pipeline/widgets.py" in problems[0], problems
    assert all("stages/io/tokens.py" in p for p in problems[1:]), problems
    assert "io/__init__.py's docstring" in problems[2], problems


def test_a_module_removed_but_still_listed_is_named(tmp_path):
    root = _copy_of_the_lists(tmp_path)
    os.remove(os.path.join(root, "pipeline", "lease.py"))
    assert module_list_problems(root) == [
        "docs/ARCHITECTURE.md's layer diagram (its pipeline/ list) names pipeline/lease.py, which does not "
        "exist: remove it, or name the module that does its job now"]


# ---------------------------------------------------------------------------------------------
# The stage contract

def _is_stage_module(node: ast.AST) -> bool:
    """`module` (what pipeline/ calls a stage's module) or `dag.module(...)`."""
    if isinstance(node, ast.Name):
        return node.id == "module"
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "module"
            and isinstance(node.func.value, ast.Name) and node.func.value.id == "dag")


def stage_names_read(paths: list[str]) -> set[str]:
    """The names these modules read on a stage module: `getattr(<stage module>, "name", ...)` and
    `<stage module>.name`."""
    found = set()
    for path in paths:
        for node in ast.walk(ast.parse(_read(path))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
                    and len(node.args) >= 2 and _is_stage_module(node.args[0])
                    and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
                found.add(node.args[1].value)
            elif isinstance(node, ast.Attribute) and _is_stage_module(node.value):
                found.add(node.attr)
    return found


def contract_rows(architecture: str) -> dict[str, tuple[bool, str]]:
    """ARCHITECTURE's stage-contract table: name -> (required, the stages that define it, as written)."""
    section = architecture.split("\n## The stage contract\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(\w+)[^`]*` \| (yes|no) \| [^|]* \| ([^|]*) \|$", section, re.M)
    return {name: (required == "yes", stages.strip()) for name, required, stages in rows}


def contract_problems(architecture: str, read: set[str], modules: dict[str, types.ModuleType]) -> list[str]:
    """What the stage-contract table gets wrong: a name pipeline/ reads (`read`; `Config` is read through gin
    as `<stage>.Config`) without a row, a row for a name nothing reads, and a row whose stages are not those
    of `modules` (stage -> its module, in DAG order) that define the name."""
    rows = contract_rows(architecture)
    expected = read | {"Config"}
    out = [f"pipeline/ reads `{name}` on a stage module, but docs/ARCHITECTURE.md's stage-contract table has "
           "no row for it: add one (required?, who calls it and when, the stages that define it)"
           for name in sorted(expected - set(rows))]
    out += [f"docs/ARCHITECTURE.md's stage-contract table has a row for `{name}`, which pipeline/ never "
            "reads on a stage module: remove it" for name in sorted(set(rows) - expected)]
    for name, (required, written) in rows.items():
        have = [stage for stage, module in modules.items() if hasattr(module, name)]
        said = list(modules) if written == "every stage" else [s.strip() for s in written.split(",")]
        if have != said:
            right = "every stage" if have == list(modules) else ", ".join(have) or "none"
            out.append(f"docs/ARCHITECTURE.md's stage-contract row `{name}` says the stages that define it "
                       f"are {written!r}; they are: {right}")
        if required and have != list(modules):
            out.append(f"`{name}` is marked required, but {', '.join(s for s in modules if s not in have)} "
                       "does not define it")
    return out


def _pipeline_modules() -> list[str]:
    return sorted(glob.glob(os.path.join(REPO, "pipeline", "*.py")))


def _stage_modules() -> dict[str, types.ModuleType]:
    return {stage: dag.module(stage) for stage in dag.STAGES}


def test_the_stage_contract_names_every_hook_and_the_stages_that_define_it():
    problems = contract_problems(_read(REPO, ARCHITECTURE), stage_names_read(_pipeline_modules()),
                                 _stage_modules())
    assert not problems, "\n".join(problems)


def test_the_hooks_are_what_pipeline_looks_up():
    """The scan finds the names `config.load`, the plan, the checks and the tasks read (a sample, so that a
    scan that found nothing could not pass the test above)."""
    assert {"run", "VERSION", "follow", "resolve", "key_inputs", "check_upstream", "summary"} \
        <= stage_names_read(_pipeline_modules())


def test_a_hook_a_stage_gains_or_pipeline_starts_reading_is_named(tmp_path, monkeypatch):
    architecture = _read(REPO, ARCHITECTURE)
    read = stage_names_read(_pipeline_modules())
    monkeypatch.setattr(dag.module("shard"), "key_inputs", lambda config: None, raising=False)
    problems = contract_problems(architecture, read, _stage_modules())
    assert len(problems) == 1 and "`key_inputs`" in problems[0] and "shard" in problems[0], problems
    extra = tmp_path / "new.py"
    extra.write_text('from pipeline import dag\n\ndef cost(stage):\n'
                     '    return getattr(dag.module(stage), "cost", None)\n')
    problems = contract_problems(architecture, stage_names_read(_pipeline_modules() + [str(extra)]),
                                 _stage_modules())
    assert any("reads `cost`" in p and "no row" in p for p in problems), problems


# ---------------------------------------------------------------------------------------------
# Commands

def _without_fences(text: str) -> str:
    return re.sub(r"^ *```.*?^ *```", "", text, flags=re.M | re.S)


def expand_braces(text: str) -> list[str]:
    """`stages/train/{launch,worker}.py` -> both paths (the first group; the rest recursively)."""
    found = re.search(r"\{([\w.-]+(?:,[\w.-]+)+)\}", text)
    if not found:
        return [text]
    return [out for choice in found.group(1).split(",")
            for out in expand_braces(text[:found.start()] + choice + text[found.end():])]


def commands(text: str) -> list[str]:
    """Every `make ...` and `python -m ...` a page shows: lines of code blocks (fenced or indented, joined
    over a trailing backslash, a `$ ` prompt dropped) and inline code spans."""
    lines, fenced, block = [], False, []
    for line in text.splitlines():
        if line.strip().startswith("```"):
            fenced = not fenced
            continue
        if fenced or line.startswith("    "):
            block.append(line.strip())
    joined: list[str] = []
    for line in block:
        if joined and joined[-1].endswith("\\"):
            joined[-1] = joined[-1][:-1].rstrip() + " " + line
        else:
            joined.append(line)
    spans = [" ".join(span.split()) for span in re.findall(r"(?<!`)`([^`]+)`(?!`)", _without_fences(text))]
    for candidate in joined + spans:
        candidate = candidate.removeprefix("$ ").replace(".venv/bin/python -m ", "python -m ", 1)
        if candidate.startswith(("make ", "python -m ")):
            lines += expand_braces(candidate)
    return lines


def is_placeholder(value: str) -> bool:
    """A value the reader fills in: `<key>`, `...`."""
    return "<" in value or "..." in value or "…" in value


def makefile() -> tuple[set[str], dict[str, str], dict[str, str]]:
    """(the .PHONY targets, target -> its recipe's text, variable -> its `?=` default) of the Makefile."""
    text = _read(REPO, "Makefile")
    phony = set(re.search(r"^\.PHONY:(.*)$", text, re.M).group(1).split())
    recipes: dict[str, str] = {}
    target = None
    for line in text.splitlines():
        if line.startswith("\t") and target:
            recipes[target] += line + "\n"
        elif found := re.match(r"^([\w-]+):", line):
            target = found.group(1)
            recipes[target] = ""
        elif line.strip() and not line.startswith("#"):
            target = None
    defaults = dict(re.findall(r"^(\w+) \?= ?(.*)$", text, re.M))
    return phony, recipes, defaults


def recipe_variables(recipe: str) -> set[str]:
    """The variables a recipe reads: `$(NAME)` and `$$NAME` (from the environment: OVERRIDES)."""
    return set(re.findall(r"\$\((\w+)\)", recipe)) | set(re.findall(r"\$\$(\w+)", recipe))


@contextlib.contextmanager
def _nothing_resolved():
    """Stage modules without `resolve` for a while: it completes a config from files outside the repository
    (train's reads init_from's config.json), which a command's text cannot be checked against."""
    saved = {}
    for stage in dag.STAGES:
        module = dag.module(stage)
        if hasattr(module, "resolve"):
            saved[module] = module.resolve
            del module.resolve
    try:
        yield
    finally:
        for module, resolve in saved.items():
            module.resolve = resolve


@functools.cache
def load_problem(gin_files: tuple[str, ...], params: tuple[str, ...], stage: str | None) -> str:
    """What `config.load` (and `--stage`'s selection) says of a command's gin files and bindings, or ""."""
    try:
        with _nothing_resolved():
            plan = config.load([os.path.join(REPO, g) for g in gin_files], params)
        if stage is not None:
            plan.tree.select(stage)
    except (config.ConfigError, ValueError) as e:
        return str(e)
    return ""


def gin_problem(path: str) -> tuple[str, str | None]:
    """(what is wrong with a gin file a command names, the file to load its bindings with). A placeholder
    under gin/ (`gin/sweeps/<name>.gin`) must match a file and loads as gin/tiny.gin; one elsewhere (a
    key's config.gin in the cache) loads as gin/tiny.gin too."""
    if is_placeholder(path):
        pattern = re.sub(r"<[^>]*>|\.\.\.|…", "*", path)
        if path.startswith("gin/") and not glob.glob(os.path.join(REPO, pattern)):
            return f"no gin file matches {path}", None
        return "", TINY
    if not os.path.isfile(os.path.join(REPO, path)):
        return f"gin file {path} does not exist", None
    return "", path


def make_problem(command: str) -> str:
    """What is wrong with one `make ...` line, or ""."""
    phony, recipes, defaults = makefile()
    words = shlex.split(command, comments=True)[1:]
    targets = [w for w in words if "=" not in w]
    values = dict(w.split("=", 1) for w in words if "=" in w)
    if len(targets) != 1 or targets[0] not in phony:
        return f"names the targets {targets}; the Makefile's are: {', '.join(sorted(phony))}"
    target, recipe = targets[0], recipes[targets[0]]
    if not values:           # `make mixsearch` in a sentence names the target; the page's examples set it
        return ""
    if unread := sorted(set(values) - recipe_variables(recipe)):
        return (f"sets {', '.join(unread)}, which `make {target}` does not read (it reads "
                f"{', '.join(sorted(recipe_variables(recipe) - {'PY', 'RUN'}))})")
    gin_var = re.search(r"--gin \$\((\w+)\)", recipe)
    if gin_var is None:
        return ""
    path = values.get(gin_var.group(1), defaults.get(gin_var.group(1), ""))
    if not path:
        return f"`make {target}` needs {gin_var.group(1)}=<a gin file>"
    problem, gin_file = gin_problem(path)
    if problem:
        return problem
    params = tuple(cli._split_overrides(values.get("OVERRIDES", "")))
    stage = values.get("STAGE")
    return load_problem((gin_file,), params, None if stage is None or is_placeholder(stage) else stage)


def python_problem(command: str) -> str:
    """What is wrong with one `python -m <module> ...` line, or ""."""
    words = shlex.split(command, comments=True)
    module, args = words[2], words[3:]
    if module.split(".")[0] not in ROOTS:
        return "" if module in EXTERNAL else \
            f"{module} is not a module of this repository (a third-party tool goes in test_docs.EXTERNAL)"
    spec = importlib.util.find_spec(module)
    if spec is None:
        return f"no module {module}"
    main = spec.origin if not spec.submodule_search_locations else \
        os.path.join(spec.submodule_search_locations[0], "__main__.py")
    if not os.path.isfile(main) or '__name__ == "__main__"' not in _read(main):
        return f"{module} does not run as a program (no `if __name__ == \"__main__\"`)"
    if not args:             # `python -m pipeline` in a sentence names the program
        return ""
    if module == "pipeline":
        return _pipeline_problem(args)
    if module == "benchmarks":
        names = importlib.import_module("benchmarks.__main__").BENCHMARKS
        unknown = [a for a in args if a not in names]
        return f"no benchmark {', '.join(unknown)}; they are: {', '.join(names)}" if unknown else ""
    source = _read(main)
    flags = re.findall(r"(?<![\w-])--[\w-]+", " ".join(args))
    unknown = [flag for flag in flags if f'"{flag}"' not in source]
    return f"{module} has no option {', '.join(unknown)}" if unknown else ""


def _pipeline_problem(args: list[str]) -> str:
    try:
        parsed = cli._parser().parse_args(cli._t5x_aliases(args))
    except SystemExit:
        return f"python -m pipeline does not take {' '.join(args)!r} (python -m pipeline --help)"
    gin_files = []
    for path in parsed.gin or [TINY]:
        problem, gin_file = gin_problem(path)
        if problem:
            return problem
        gin_files.append(gin_file)
    params = tuple(parsed.gin_param) + tuple(cli._split_overrides(parsed.overrides))
    stage = None if parsed.stage is None or is_placeholder(parsed.stage) else parsed.stage
    return load_problem(tuple(gin_files), params, stage)


def command_problem(command: str) -> str:
    return make_problem(command) if command.startswith("make ") else python_problem(command)


def _page_commands() -> list[tuple[str, str]]:
    return [(page, command) for page in PAGES for command in dict.fromkeys(commands(_read(REPO, page)))]


def test_the_pages_show_commands():
    """The extraction finds what the README shows (so a broken extraction cannot pass the test below)."""
    shown = [c for page, c in _page_commands() if page == "README.md"]
    assert any(c.startswith("make pipeline OVERRIDES='clean.Config.min_chars=1000'") for c in shown), shown
    assert any(c.startswith("make sweep SWEEP=gin/sweeps/min_chars.gin") for c in shown), shown
    assert len(shown) > 20, shown


@pytest.mark.parametrize("page", PAGES)
def test_every_command_a_page_shows_parses(page):
    problems = [f"{page}: `{command}`: {problem}" for command in dict.fromkeys(commands(_read(REPO, page)))
                if (problem := command_problem(command))]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("command, says", [
    ("make pipelin", "names the targets ['pipelin']"),
    ("make pipeline GIN=gin/nope.gin", "gin file gin/nope.gin does not exist"),
    ("make pipeline SWEEP=gin/sweeps/lr.gin", "sets SWEEP, which `make pipeline` does not read"),
    ("make pipeline OVERRIDES='clean.Config.min_char=1'", "min_char"),
    ("make stage STAGE=cleen", "unknown stage 'cleen'"),
    ("make sweep OVERRIDES='sweep.seeds=3'", "`make sweep` needs SWEEP="),
    ("make sweep SWEEP=gin/sweeps/<nothing-like-it>x.gin", "no gin file matches"),
    ("python -m pipeline rum", "does not take"),
    ("python -m pipeline run --gin-param 'tokenizer.Config.vocab=3'", "vocab"),
    ("python -m benchmarks fast_things", "no benchmark fast_things"),
    ("python -m stages.evaluate.harness --train x --trian y", "no option --trian"),
    ("python -m stages.nothing", "no module stages.nothing"),
    ("python -m pipeline.dag", "does not run as a program"),
    ("python -m fairseq.train", "not a module of this repository"),
])
def test_a_command_that_would_fail_is_named(command, says):
    assert says in command_problem(command)


def test_placeholders_and_comments_are_read_as_a_reader_does():
    assert command_problem("make stage STAGE=<it> FORCE=1") == ""
    assert command_problem("make sweep SWEEP=gin/sweeps/<name>.gin   # one of them") == ""
    assert command_problem("python -m pipeline run --gin <attempt>/config.gin --stage <stage>") == ""
    assert command_problem("make mixsearch") == "" and command_problem("python -m pipeline") == ""
    assert commands("```sh\n$ python -m stages.evaluate.harness --train a \\\n    --tasks b\n```\n") == \
        ["python -m stages.evaluate.harness --train a --tasks b"]
    assert commands("see `make  plan\nDAYS=30` and `gin/{a,b}.gin`") == ["make plan DAYS=30"]


# ---------------------------------------------------------------------------------------------
# Paths and links

def _ignored_roots() -> tuple[str, ...]:
    """Folders .gitignore keeps out of the repository (the cache, benchmark outputs): a page may name them."""
    return tuple(line.strip("/") + "/" for line in _read(REPO, ".gitignore").splitlines()
                 if line.startswith("/") and line.endswith("/"))


def paths(text: str) -> list[str]:
    """The repository paths a page names: inline code spans that are a path under one of ROOTS or a Python
    file's name (`loop.py`), and such paths in its prose (with an extension, so a word is not taken for
    one)."""
    prose = _without_fences(text)
    root = "|".join(ROOTS)
    spans = [s for s in re.findall(r"(?<!`)`([^`\s]+)`(?!`)", prose)
             if re.fullmatch(rf"(?:{root})/\S*|[\w{{}},]+\.py", s)]
    bare = re.findall(rf"(?<![\w/.`-])((?:{root})/[\w/.-]*\w\.(?:py|gin|md|json|cfg))(?![\w`])", prose)
    return list(dict.fromkeys(p for found in spans + bare for p in expand_braces(found)))


@functools.cache
def _python_files() -> frozenset[str]:
    """The names of the repository's Python files (`planner.py`, `setup.py`), wherever they are, and those a
    page names as the user's own (USER_FILES)."""
    found = glob.glob(os.path.join(REPO, "*.py")) + [
        p for root in ROOTS for p in glob.glob(os.path.join(REPO, root, "**", "*.py"), recursive=True)]
    return frozenset(os.path.basename(p) for p in found) | frozenset(USER_FILES)


def path_problem(path: str) -> str:
    if "/" not in path:          # a module by its file name alone (`planner.py` in a stage's section)
        return "" if path in _python_files() else f"{path} is no file of this repository"
    if path.startswith(_ignored_roots()):
        return ""
    pattern = re.sub(r"<[^>]*>|\.\.\.|…", "*", path)      # `gin/<name>.gin`, `stages/...`: any
    if not glob.glob(os.path.join(REPO, pattern)):
        return f"{path} does not exist"
    return ""


def link_problems(page: str, text: str) -> list[str]:
    """Each relative link of a page that does not resolve from the page's folder."""
    out = []
    for target in re.findall(r"\]\(([^)\s]+)\)", _without_fences(text)):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue
        if not os.path.exists(os.path.join(REPO, os.path.dirname(page), target.split("#")[0])):
            out.append(f"{page}: the link ({target}) leads nowhere")
    return out


@pytest.mark.parametrize("page", PAGES)
def test_every_path_and_link_a_page_names_exists(page):
    text = _read(REPO, page)
    problems = [f"{page}: {problem}" for path in paths(text) if (problem := path_problem(path))]
    problems += link_problems(page, text)
    assert not problems, "\n".join(problems)


def test_a_path_that_is_gone_is_named():
    text = ("`stages/io/storage.py`, `stages/train/{loop,gone}.py` and stages/io/old.py; "
            "`cache/train/<key>`, `moe.py`, `elsewhere.py`")
    found = paths(text)
    assert found == ["stages/io/storage.py", "stages/train/loop.py", "stages/train/gone.py", "moe.py",
                     "elsewhere.py", "stages/io/old.py"], found
    assert [path_problem(p) for p in found] == ["", "", "stages/train/gone.py does not exist", "",
                                                "elsewhere.py is no file of this repository",
                                                "stages/io/old.py does not exist"]
    assert link_problems("docs/x.md", "[a](nowhere.md) [b](ARCHITECTURE.md) [c](https://x.org)") == \
        ["docs/x.md: the link (nowhere.md) leads nowhere"]


def test_the_flagships_days_in_the_pages_are_what_make_plan_prints():
    """README and docs/training.md quote the flagship's days, step, MFU and goodput: the plan's, as
    `make plan GIN=gin/600b.gin` prints them (figures.num, one decimal for percentages)."""
    from stages.train.planning import figures, planner

    p = planner.plan(config.load([os.path.join(REPO, "gin", "600b.gin")], []).stages["train"].config)
    days, step = figures.num(p.days), figures.num(p.step_s)
    mfu, goodput = f"{p.predicted.mfu:.1%}", f"{p.goodput.share:.1%}"
    readme = _read(REPO, "README.md")
    assert (f"**{days} days** ({step} s a step, {mfu} MFU, {goodput} goodput)") in readme
    training = " ".join(_read(REPO, "docs", "training.md").split())
    assert f"in {days} days by the predicted step time and goodput ({step} s a step, {mfu} MFU, {goodput}" \
        in training
    assert f"| {days} at {goodput} goodput ({mfu}) |" in _read(REPO, "docs", "planning.md")

