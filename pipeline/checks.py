"""The pre-run checks: what stops a command before any stage starts, each as one line ("" when nothing does).

    problem = checks.arguments(workers=0, scheduler=None)   # "--workers 0: ..."
    problem = checks.unreachable(plan) or checks.unknown_keys(plan) or checks.cannot_run(plan, stages)

`python -m pipeline` (pipeline/__main__.py) runs them after the config has loaded (pipeline/config.py
catches everything a config alone can get wrong) and prints the first problem as one `error:` line with
exit status 2. They cover what needs the command line, the cache root, the inputs or the machine: the
Luigi workers and scheduler, a cache root with an unknown scheme or that cannot be reached or written,
a regular file where a stage's directory should be, inputs that cannot be listed, a stage's own plan that
cannot be made and its own `check(config)` (the training mesh against the devices its processes will have,
and init_from's checkpoint: its files inside its directory, every safetensors header, config.json, a
tokenizer file; download's files: a glob that matches a directory, an extension no reader takes, a first
record without the text field, files that hold no record at all; clean's nltk splitter without its trained
punkt; the tokenizer's pretrained model; yardsticks' reference files: none with text; evaluate's lm-eval
tasks: names resolved, YAMLs parsed, data reachable)
and `check_upstream` (a stage's config against the stages it reads: shard's validation split, evaluate's
contamination check against what is scored, train's init_from tokenizer against the pieces the run's
tokenizer will have and its mixture against what its sources' downloads can hold; export's model against
the transformers classes). Every check is cheap: a listing, a connection, a probe file, the first record
or header of a file. tests/pipeline/test_bad_config.py and its neighbours (test_bad_inputs.py,
test_bad_checkpoint.py, test_bad_tasks.py, test_bad_clean_checks.py, test_bad_hardware.py,
test_bad_mixture.py) hold one case of each.
"""

from __future__ import annotations

import os
import socket

from pipeline import dag
from pipeline.plan import InputsError, Plan
from stages.io import storage

SCHEDULER_PROBE_S = 3.0   # how long a --scheduler may take to accept a connection before the run gives up


def arguments(workers: int, scheduler: str | None) -> str:
    """What is wrong with the command line's `--workers` and `--scheduler`: a worker count below 1, a
    scheduler that is not HOST:PORT, or one where nothing accepts a connection (Luigi would retry it for a
    minute and print hundreds of lines before failing)."""
    if workers < 1:
        return f"--workers {workers}: the number of Luigi workers must be >= 1 (1 runs one stage at a time)"
    if scheduler is None:
        return ""
    host, _, port = scheduler.rpartition(":")
    if not port.isdigit() or not 0 < int(port) < 65536:
        return (f"--scheduler {scheduler!r} is not HOST:PORT (e.g. localhost:8082, where `luigid --port "
                "8082` listens); leave it out to use a scheduler inside this run")
    try:
        socket.create_connection((host or "localhost", int(port)), timeout=SCHEDULER_PROBE_S).close()
    except OSError as e:
        why = e.strerror or str(e) or type(e).__name__
        return (f"--scheduler {scheduler}: no Luigi scheduler answers there ({why}); start one "
                f"(`luigid --port {port}`) or leave --scheduler out to use a scheduler inside this run")
    return ""


def unreachable(plan: Plan) -> str:
    """Why the cache root cannot be used, in one line, or "" when it can be reached (and no stage's
    directory in it is a file)."""
    if problem := storage.scheme_problem(plan.cache_root):
        return f"cannot reach the cache root {plan.cache_root}: {problem} (pipeline.Settings.cache_root)"
    try:
        storage.existing_directory(plan.cache_root)     # a local root under a regular file: no listing works
        storage.check_reachable(plan.cache_root)
    except Exception as e:  # noqa: BLE001 - any failure to reach storage ends the same way: one clear line
        return f"cannot reach the cache root {plan.cache_root}: {type(e).__name__}: {e}".splitlines()[0]
    return stage_directories(plan)


def stage_directories(plan: Plan) -> str:
    """A regular file where a stage's directory `<cache_root>/<stage>` must be, named in one line, or ""
    (every read of the cache, planning's included, would fail on it with NotADirectoryError). Local roots
    only: a bucket holds an object and a prefix of the same name side by side."""
    if not storage.is_local(plan.cache_root):
        return ""
    for stage in dict.fromkeys(sp.stage for sp in plan.stages.values()):
        path = storage.join(plan.cache_root, stage)
        if os.path.exists(storage.local_path(path)) and not os.path.isdir(storage.local_path(path)):
            return (f"{path} is a file, not a directory: the cache keeps the {stage} stage's outputs there; "
                    "move the file away, or set pipeline.Settings.cache_root to another directory")
    return ""


def unwritable(cache_root: str) -> str:
    """Why no file can be made in a local cache root, in one line, or "" when one can (or it is a bucket)."""
    if reason := storage.unwritable(cache_root):
        return (f"cannot write to the cache root {cache_root} ({reason}); set pipeline.Settings.cache_root "
                "to a directory you can write")
    return ""


def unknown_keys(plan: Plan) -> str:
    """Why a key cannot be computed (a stage's inputs cannot be listed), or "" when every key can."""
    try:
        for sp in plan.stages.values():
            sp.key   # noqa: B018 - computed here so a listing failure is one line, not a traceback
    except InputsError as e:
        return str(e)
    return ""


def cannot_run(plan: Plan, stages: list[str]) -> str:
    """What stops `stages` of `plan` before they start, in one line, or "": a stage's own plan that cannot
    be made (its optional `plan(config)` raising ValueError: a training mesh that does not tile the chips
    train.HardwareConfig names), what its optional `check(config)` returns (training: a CPU mesh or batch
    that does not fit the devices its processes will have, a config the planner says cannot fit;
    download: files its readers cannot take) and its optional `check_upstream(config, {upstream stage:
    config})` (shard: a val split larger than the tokenizer's held-out set; export: a model no transformers
    class holds, trained to the end for nothing otherwise), a local cache root where no
    file can be made. With nothing to run, nothing is written: a fully cached run on a read-only cache is
    fine."""
    for stage in stages:
        cfg, module = plan.stages[stage].config, dag.module(stage)
        fn, check = getattr(module, "plan", None), getattr(module, "check", None)
        try:
            if fn is not None:
                fn(cfg, compile=False)
        except ValueError as e:
            return f"{stage}: {e}"
        if check is not None and (problem := check(cfg)):
            return f"{stage}: {problem}"
        # A stage's config against what the cache already holds of its inputs (train: a mixture that would
        # repeat a source past its limit, counted from the committed shards' manifests): first, as the
        # exact count says more than the bound check_upstream may give from the configs.
        committed = getattr(module, "check_inputs", None)
        if committed is not None and (problem := committed(cfg, inputs(plan, stage))):
            return f"{stage}: {problem}"
        # A stage's config against its inputs' configs (shard: its val split inside the tokenizer's held-out
        # set; export: a model transformers can hold), so a mismatch fails now, not after the upstream
        # stages ran.
        if problem := upstream_problem(plan, stage):
            return f"{stage}: {problem}"
    return unwritable(plan.cache_root) if stages else ""


def upstream_problem(plan: Plan, node: str) -> str:
    """What `node`'s optional `check_upstream(config, upstream_configs(plan, node))` says of its config
    against the planned configs of the stages above it, in one line, or "" (`cannot_run` refuses it; `make
    plan` prints it)."""
    check = getattr(dag.module(node), "check_upstream", None)
    return check(plan.stages[node].config, upstream_configs(plan, node)) if check is not None else ""


def upstream_configs(plan: Plan, node: str) -> dict:
    """{the name `node`'s stage reads each input by: its config}, and every node further upstream by its node
    name (`download[web]`): what a stage's `check_upstream` weighs its config against."""
    sp = plan.stages[node]
    found = {sp.input_names.get(u.name, u.name): u.config for u in sp.upstream_plans}
    above = [u for u in plan.tree.closure(node) if u != node and u not in sp.upstream]
    return found | {u: plan.stages[u].config for u in above}


def inputs(plan: Plan, node: str, closure: bool = False, read: bool = True) -> dict:
    """{the name `node`'s stage reads each input by: its committed output, or None when not built yet or
    when its key is unknown (its inputs cannot be listed: offline, planning a hub dataset)}. With `closure`,
    every node upstream of it too, by node name (`clean[code]`), for what planning estimates from them.
    `read=False` reads no cache (a run file whose cache root is still a placeholder): every value is None."""
    sp = plan.stages[node]

    def committed(u: str):
        if not read:
            return None
        try:
            return plan.committed(u)
        except InputsError:
            return None

    found = {sp.input_names.get(u, u): committed(u) for u in sp.upstream}
    if closure:
        found |= {u: committed(u) for u in plan.tree.closure(node) if u != node and u not in found}
    return found
