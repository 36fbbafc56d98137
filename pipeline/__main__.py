"""The command line. `make pipeline`, `make stage`, `make status` wrap it.

    python -m pipeline run    --gin gin/tiny.gin [--gin-param 'clean.Config.min_chars=100' ...]
                              [--stage tokenizer] [--force] [--workers N] [--scheduler HOST:PORT]
    python -m pipeline status --gin gin/tiny.gin      # stage, key, cached?, size, wall time, path, and
                                                      # "built by other code: ..." (pipeline/provenance.py)
    python -m pipeline plan   --gin gin/tiny.gin      # the keys, what a run would execute, the train plan
    python -m pipeline plan   --gin gin/600b.gin --days 30   # and the smallest TPU slice that trains it in 30
    python -m pipeline sweep  --gin gin/sweeps/lr.gin # every variant in one build, then a comparison
    python -m pipeline mixsearch --gin gin/mixsearch/prose_code.gin   # proxies, a fit, the predicted mixture

A run with several sources (train.Mixture) is a tree of nodes (`clean[code]`, pipeline/dag.py): `--stage`
names a node, or a stage for every source's instance of it (`--stage clean --force` recleans them all).

T5X habits work too: `--gin_file=F` is `--gin F` and `--gin.NAME=VALUE` is `--gin-param NAME=VALUE`.
`--overrides 'a.b=1 c.d="x y"'` takes many bindings in one string (how the Makefile passes
OVERRIDES through untouched). The exit status is non-zero when any stage fails.

Every problem that can be known before a stage runs ends the command with one `error: ...` line on
stderr and exit status 2, before anything runs: the config (pipeline/config.py), an unknown `--stage`,
placeholders left to fill in, and the pre-run checks of pipeline/checks.py (`--workers` below 1, a
`--scheduler` where no luigid answers, a cache root with an unknown scheme or that cannot be reached,
inputs that cannot be listed, a stage's own plan or `check(config)`, and, for `run` and `sweep` (which
write), a local cache root where no file can be created). tests/pipeline/test_bad_config.py holds one
case of each.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time

from pipeline import cache, checks, config, dag, provenance
from pipeline import plan as run_plan
from stages.io import storage
from stages.train.stop import STOPPED_EXIT_CODE  # a stage stopped on request after saving: rerun to resume


def main(argv: list[str] | None = None) -> int:
    start = time.time()
    args = _parser().parse_args(_t5x_aliases(sys.argv[1:] if argv is None else argv))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    for noisy in ("apache_beam", "luigi", "luigi-interface", "absl", "gcsfs", "fsspec", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    params = list(args.gin_param) + _split_overrides(args.overrides)
    if args.command in ("run", "sweep", "mixsearch") and (problem := checks.arguments(args.workers,
                                                                                      args.scheduler)):
        return _error(problem)
    gin_files = args.gin or [os.path.join(config.GIN_DIR, "tiny.gin")]
    if args.command == "sweep":
        return _sweep(gin_files, params, args, start)
    if args.command == "mixsearch":
        return _mixsearch(gin_files, params, args, start)
    try:
        plan = config.load(gin_files, params)
        if args.stage:
            plan.tree.select(args.stage)
    except (config.ConfigError, ValueError) as e:
        return _error(str(e))
    unfilled = config.placeholders(plan)
    if unfilled and args.command != "plan":
        return _error(f"{', '.join(plan.gin_files) or 'the config'} leaves placeholders to fill in: "
                      f"{'; '.join(unfilled)}")
    if unfilled:          # planning needs only the config: say what is left to fill in, touch no storage
        print(f"note: fill in before running: {'; '.join(unfilled)} (the cache is not checked)")
    elif problem := checks.unreachable(plan):
        return _error(problem)
    if args.command != "plan" and (problem := checks.unknown_keys(plan)):
        return _error(problem)
    if args.command == "status":
        print(status_table(plan))
        return _verify(plan) if args.verify else _collect_garbage(plan.cache_root) if args.gc else 0
    if args.command == "plan":
        try:
            _stage_plans(plan, _targets(plan, args), compile=False)    # fails before any output, and fast
            slices = _smallest_slice(plan, _targets(plan, args), args.days)
        except ValueError as e:
            return _error(str(e))
        print(status_table(plan, targets=_targets(plan, args), check_cache=not unfilled))
        for line in _stage_plans(plan, _targets(plan, args), args.compile, read_cache=not unfilled):
            print(line)
        if slices:
            print(slices)
        return 0
    if problem := checks.cannot_run(plan, todo := _to_run(plan, args)):
        return _error(problem)
    if not todo:    # all cached, none forced: Luigi would find every task complete, so it is not imported
        print(_outcome(plan, args, ran=[]))
        print(f"done in {time.time() - start:.1f} s: 0 stage(s) ran, "
              f"{len(plan.tree.closure(*_targets(plan, args)))} reused from {plan.cache_root}")
        return 0
    return _run(plan, args, start)


def _verify(plan: run_plan.Plan) -> int:
    """`status --verify`: compares every committed stage's files with the checksums its manifest recorded;
    a damaged stage is un-committed (its manifest kept as _DAMAGED-<time>.json) so the next run rebuilds
    it. Exit status 1 when anything was damaged."""
    damaged = 0
    for stage, sp in plan.stages.items():
        done = plan.committed(stage)
        if done is None:
            continue
        problems = cache.verify(done)
        if not problems:
            print(f"verify: {stage} {sp.key[:12]}: {len(done.files)} files match their checksums"
                  if done.manifest.get("checksums") else
                  f"verify: {stage} {sp.key[:12]}: committed before checksums were recorded; sizes match")
            continue
        damaged += 1
        kept = cache.uncommit(plan.cache_root, sp.stage, sp.key)
        for problem in problems:
            print(f"verify: {stage} {sp.key[:12]}: DAMAGED {problem}")
        print(f"verify: {stage} {sp.key[:12]}: no longer counts as done (manifest kept as {kept}); the next "
              "run that needs it rebuilds it")
    return 1 if damaged else 0


def _collect_garbage(cache_root: str) -> int:
    """`status --gc` (`make gc`): removes the attempts no manifest names under keys no live lease holds. An
    attempt that cannot be removed (no delete permission, an outage) is one line on stderr and exit status
    1; the others are removed all the same."""
    found = cache.garbage(cache_root)
    failed = 0
    for path in found:
        print(f"gc: removing {path}")
        try:
            storage.remove(path)
        except OSError as e:
            failed += 1
            print(f"gc: could not remove {path}: {e}", file=sys.stderr)
    print(f"gc: {len(found) - failed} stale attempt(s) removed from {cache_root}"
          + (f"; {failed} could not be removed (above)" if failed else ""))
    return 1 if failed else 0


def _error(message: str) -> int:
    """Ends a command on a problem found before anything ran: one line on stderr, exit status 2."""
    one_line = " ".join(line.strip() for line in message.splitlines() if line.strip())
    print(f"error: {one_line}", file=sys.stderr)
    return 2


def _stage_plans(plan: run_plan.Plan, targets: list[str], compile: bool | None,
                 read_cache: bool = False) -> list[str]:
    """Each stage's own plan (its optional `plan(config, compile=...)`: the train stage's memory and time,
    and with `compile` XLA's figure for the named TPU topology), what its `check_upstream` would refuse
    (export: a model no transformers class holds), and with `read_cache` what its committed
    inputs add (`plan_inputs(config, inputs)`: a mixture's tokens and epochs per source; without it, what
    the config alone says: a mixture's tokens asked per source and phase)."""
    out = []
    for stage in plan.tree.closure(*targets):
        fn = getattr(dag.module(stage), "plan", None)
        try:
            if fn is not None:
                text = fn(plan.stages[stage].config, compile=compile)
                # a node of the reference run (train[reference]) says whose plan it is
                out.append(f"{stage}: {text}" if dag.source_of(stage) == dag.REFERENCE else text)
        except ValueError as e:      # the config cannot be planned (a mesh that does not tile the chips)
            raise ValueError(f"{stage}: {e}") from None
        # what `run` would refuse from the upstream configs (export: a model no transformers class holds)
        if text := checks.upstream_problem(plan, stage):
            out.append(f"{stage}: a run would stop here: {text}")
        # what the stage's inputs in the cache say of its plan (train: the mixture's tokens and epochs)
        fn = getattr(dag.module(stage), "plan_inputs", None)
        if fn is not None and (text := fn(plan.stages[stage].config,
                                          checks.inputs(plan, stage, closure=True, read=read_cache))):
            out.append(text)
    return out


def _smallest_slice(plan: run_plan.Plan, targets: list[str], days: float | None) -> str:
    """`plan --days N`: the smallest TPU slice of the configured generation that trains the configured tokens
    in N days and fits (stages/train/planning/search.py `smallest_slice`); "" without --days."""
    if days is None:
        return ""
    if "train" not in plan.tree.closure(*targets):
        raise ValueError(f"--days {days:g} plans the train stage, which --stage does not build")
    if not days > 0:
        raise ValueError(f"--days {days:g} must be > 0")
    from stages.train.planning import search

    return search.smallest_slice(plan.stages["train"].config, days).render()


def _run(plan: run_plan.Plan, args, start: float) -> int:
    from pipeline import tasks, tracked

    result = tasks.build([plan], _targets(plan, args), force=_force(args), workers=args.workers,
                         scheduler=args.scheduler)
    took = time.time() - start
    if not result.ok and (lost := checks.unreachable(plan)):   # the storage went away mid-run: no table
        print(result.summary, file=sys.stderr)
        print(f"error: {lost}; no stage that failed was committed: rerun once it can be reached",
              file=sys.stderr)
        print(f"FAILED after {took:.1f} s: see the errors above.", file=sys.stderr)
        return 1
    print(_outcome(plan, args, ran=result.ran))
    took = time.time() - start
    if not result.ok and result.stopped:      # preempted on purpose (SIGTERM): an expected end, one line
        print(f"stopped after {took:.1f} s: {'; '.join(result.stopped)}", file=sys.stderr)
        return STOPPED_EXIT_CODE
    if not result.ok:
        _failures(result)
        print(f"FAILED after {took:.1f} s: see the errors above.", file=sys.stderr)
        return 1
    tracked.annotate(plan, result.run_id)
    took = time.time() - start
    print(f"done in {took:.1f} s: {len(result.ran)} stage(s) ran, "
          f"{len(plan.tree.closure(*_targets(plan, args))) - len(result.ran)} reused from {plan.cache_root}")
    return 0


def _outcome(plan: run_plan.Plan, args, ran: list[str]) -> str:
    """The status table of what the run covered, then each stage's one-line summary."""
    lines = [status_table(plan, targets=_targets(plan, args), ran=ran)]
    for stage in plan.tree.closure(*_targets(plan, args)):
        if line := _highlight(plan, stage):
            lines.append(f"  {stage}: {line}")
    return "\n".join(lines)


def _failures(result) -> None:
    """What failed, on stderr: a stage's refusal (its guard's verdict, `stages.io.refusal.Refusal`) as one
    `error:` line, as a mistake found before work is, its traceback left out; Luigi's summary when anything
    else failed (that traceback is in the log above)."""
    for refusal in result.refused:
        one_line = " ".join(line.strip() for line in refusal.splitlines() if line.strip())
        print(f"error: {one_line}", file=sys.stderr)
    if result.crashed or not result.refused:
        print(result.summary, file=sys.stderr)


def _sweep(gin_files: list[str], params: list[str], args, start: float) -> int:
    from pipeline import sweep, tasks, tracked

    try:
        runs = sweep.runs(gin_files, params)
        for run in runs if args.stage else ():
            run.plan.tree.select(args.stage)
    except (config.ConfigError, ValueError) as e:
        return _error(str(e))
    for run in runs:
        plan = run.plan
        if unfilled := config.placeholders(plan):
            return _error(f"sweep variant {run.variant!r} leaves placeholders to fill in: "
                          f"{'; '.join(unfilled)}")
        problem = checks.unreachable(plan) or checks.unknown_keys(plan)
        if problem or (problem := checks.cannot_run(plan, _to_run(plan, args))):
            return _error(f"sweep variant {run.variant!r}: {problem}")
    result = tasks.build([run.plan for run in runs], [args.stage] if args.stage else None,
                         workers=args.workers, scheduler=args.scheduler)
    if not result.ok:
        _failures(result)
        print(f"sweep FAILED after {time.time() - start:.1f} s", file=sys.stderr)
        return 1
    for run in runs:
        tracked.annotate(run.plan, result.run_id)
    print(sweep.compare(sweep.sweep_name(gin_files), runs))
    ran = ", ".join(result.ran) or "none"
    variants = len({run.variant for run in runs})
    print(f"done in {time.time() - start:.1f} s: {variants} variants x {len(runs) // variants} seed(s); "
          f"stages that ran: {ran}")
    return 0


def _mixsearch(gin_files: list[str], params: list[str], args, start: float) -> int:
    from pipeline import mixsearch

    try:
        _, plan = mixsearch.settings(gin_files, params)
    except (config.ConfigError, ValueError) as e:
        return _error(str(e))
    if unfilled := config.placeholders(plan):
        return _error(f"{', '.join(gin_files)} leaves placeholders to fill in: {'; '.join(unfilled)}")
    problem = checks.unreachable(plan) or checks.unknown_keys(plan)
    # a mixture search builds up to evaluate and never exports: the export's check is not its business
    built = set(plan.tree.closure(*plan.tree.select("evaluate")))
    if problem or (problem := checks.cannot_run(plan, [s for s in _to_run(plan, args) if s in built])):
        return _error(problem)
    try:
        print(mixsearch.run(gin_files, params, workers=args.workers, scheduler=args.scheduler))
    except (ValueError, RuntimeError) as e:
        print(f"mixsearch FAILED after {time.time() - start:.1f} s: {e}", file=sys.stderr)
        return 1
    print(f"done in {time.time() - start:.1f} s")
    return 0


def _force(args) -> list[str]:
    """The stages `--force` names: `--stage`, or the first stage (so every stage); none for a sweep or
    without --force. What they rerun with them is `dag.Tree.forced`."""
    if not args.force or args.command != "run":
        return []
    return [args.stage or next(iter(dag.STAGES))]


def _to_run(plan: run_plan.Plan, args) -> list[str]:
    """The stages the command would execute: the forced ones and those of its targets not yet cached."""
    return run_plan.to_run(plan, _targets(plan, args), plan.tree.forced(*plan.tree.select_all(_force(args))))


def _targets(plan: run_plan.Plan, args) -> list[str]:
    """What to build, as nodes of the plan: `--stage S` builds S (every source's S when S is a per-source
    stage named without a source) and what it needs; forcing S also rebuilds what depends on it, so stale
    downstream outputs are never left behind. No stage: everything."""
    if args.stage and args.force:
        return plan.tree.sinks(plan.tree.forced(*plan.tree.select(args.stage)))
    if args.stage:
        return plan.tree.select(args.stage)
    return plan.tree.sinks()


def status_table(plan: run_plan.Plan, targets: list[str] | None = None, ran: list[str] = (),
                 check_cache: bool = True) -> str:
    """One row per node: `stage  key[:12]  status  size  wall  path`, and after the path of a committed entry
    what `provenance.compare` says of the code that built it: "built by other code: stages/clean source
    3f2a1b2c then, 9c1d0e4f now (changed: stages/clean/quality.py); commit a603a9b", or "code unknown" for
    one committed before manifests recorded it; nothing when it is today's code."""
    stages = plan.tree.closure(*targets) if targets else list(plan.stages)
    rows = [("stage", "key", "status", "size", "wall", "path")]
    unknown = ""
    for name in stages:
        sp = plan.stages[name]
        try:
            sp.key   # noqa: B018
        except run_plan.InputsError as e:   # `plan` offline: the configs are known, this key is not
            unknown = unknown or str(e)
            rows.append((name, "?", "unknown", "-", "-", "-"))
            continue
        done = plan.committed(name) if check_cache else None
        if done is None:
            state = "missing" if check_cache else "-"
            size, wall, path = "-", "-", cache.stage_dir(plan.cache_root, sp.stage, sp.key)
        else:
            state = "ran" if name in ran else "cached"
            size = _human(sum(done.files.values()))
            wall = f"{done.manifest.get('wall_time_s', 0):.1f} s"
            # built by other code than now under the same VERSION, or before manifests said: on its line
            code = provenance.compare(done.manifest, sp.stage)
            path = f"{done.path}  {code}" if code else done.path
        rows.append((name, sp.key[:12], state, size, wall, path))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    table = "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1] for r in rows)
    return table + (f"\nnote: {unknown}" if unknown else "")


def _highlight(plan: run_plan.Plan, stage: str) -> str:
    """The stage's own one-line summary (its optional `summary(committed)`), if it has one."""
    summary = getattr(dag.module(stage), "summary", None)
    done = plan.committed(stage)
    if summary is None or done is None:
        return ""
    try:
        return summary(done)
    except Exception as e:  # noqa: BLE001 - a summary must never turn a finished run into a failure
        return f"(no summary: {e})"


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return ""


def _split_overrides(text: str) -> list[str]:
    """'a.b=1 c.d="x y" e.f=[1, 2] g.h = 3' -> ['a.b=1', 'c.d="x y"', 'e.f=[1, 2]', 'g.h = 3'].

    Splits on whitespace outside quotes and brackets and keeps the quotes gin needs.
    """
    tokens, current, quote, depth = [], "", "", 0
    for ch in text or "":
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch.isspace() and depth == 0:
            if current:
                tokens.append(current)
            current = ""
            continue
        current += ch
    if current:
        tokens.append(current)
    out: list[str] = []
    for token in tokens:
        if out and (token.startswith("=") or out[-1].endswith("=")):
            out[-1] += " " + token
        else:
            out.append(token)
    return out


def _t5x_aliases(argv: list[str]) -> list[str]:
    out = []
    for arg in argv:
        if arg.startswith("--gin_file="):
            out += ["--gin", arg.split("=", 1)[1]]
        elif arg == "--gin_file":
            out.append("--gin")
        elif arg.startswith("--gin.") and "=" in arg:
            out += ["--gin-param", arg[len("--gin."):]]
        elif arg.startswith("--gin_bindings="):
            out += ["--gin-param", arg.split("=", 1)[1]]
        else:
            out.append(arg)
    return out


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m pipeline", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("command", choices=("run", "status", "plan", "sweep", "mixsearch"))
    p.add_argument("--gin", action="append", default=[], metavar="FILE",
                   help="gin file (repeatable; later files override earlier ones); default gin/tiny.gin")
    p.add_argument("--gin-param", action="append", default=[], metavar="BINDING",
                   help="one gin binding, e.g. tokenizer.Config.vocab_size=3000 (repeatable)")
    p.add_argument("--overrides", default="", metavar="'B1 B2'", help="several bindings in one string")
    p.add_argument("--stage", help=f"build only this stage and what it needs ({', '.join(dag.STAGES)})")
    p.add_argument("--force", action="store_true",
                   help="rerun --stage (default: all) even if cached, and everything downstream of it")
    p.add_argument("--workers", type=int, default=1, help="Luigi workers (parallel stages)")
    p.add_argument("--scheduler", metavar="HOST:PORT", help="a central luigid scheduler (default: local)")
    p.add_argument("--verify", action="store_true",
                   help="status: check every committed stage's files against their recorded checksums; a "
                        "damaged stage is rebuilt by the next run")
    p.add_argument("--gc", action="store_true",
                   help="status: remove attempts that no manifest names and no live run holds (make gc)")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="plan: also compile the train step for train.HardwareConfig.topology ahead of time "
                        "(default: when a topology is named)")
    p.add_argument("--days", type=float, metavar="N",
                   help="plan: also the smallest slice of the configured TPU generation that trains the "
                        "configured tokens in N days (its step over its goodput: checkpoints, evaluations, "
                        "restarts) and fits (make plan DAYS=N)")
    return p


if __name__ == "__main__":
    sys.exit(main())
