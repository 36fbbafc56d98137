"""Fault injection: kill a stage of the tiny DAG at a chosen point, rerun the same command, and check that
nothing partial was taken as done and that the rerun's outputs equal an undisturbed run's.

    python -m tests.faults.harness --n 200     # `make faults N=200`: seeds 0..N-1 (--start S: S..S+N-1),
                                               # a table, and benchmarks/out/faults.json; exit 1 on a problem
    python -m tests.faults.harness --dag mixture --n 33    # the prose + code tree: every node x point once
    python -m pytest -p no:cacheprovider tests/faults    # a fixed case per stage (test_faults.py)

A case (`Case`) names a stage, a kill point and a seed; the run is `python -m pipeline run --stage <stage>`
(the stage and what it needs) with `SMALL` from tests/tiny_run.py and a checkpoint every 3 steps, on a cache
that holds the reference's commits of the stages upstream of the killed one (copied): what needs computing is
the killed stage alone.
Kill points, the moment drawn from `random.Random(seed)`:

    random   SIGKILL the run's whole process group a seeded delay after the stage's `running <stage>` log
             line, the delay drawn from [0, the stage's undisturbed wall time): during Beam writes, during
             sentencepiece training, mid-checkpoint, ... statistically
    commit   every output file is written and the manifest is not: `cache.KILL_BEFORE_COMMIT` names the
             stage and `cache.run_stage` SIGKILLs its own process at that instant
    gcs      as `random`, with the cache on the GCS emulator: a kill while the stage uploads its outputs

After the kill, every stage that `cache.load` counts as done must pass `cache.verify` and equal the
reference (a partial stage taken as done would not), and `python -m pipeline status` must agree with
`load`. Then the same command reruns to completion and each stage it covers is compared with an
undisturbed reference run on another cache root (`differences`): data stages file by file, training's
metrics step for step and its summary.json, evaluation's eval.json (timing fields left out). No attempt
nor `work/` may be left behind, and no document of the reference's clean output may be missing from the
rerun's ("records lost").
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import os
import posixpath
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid

from pipeline import cache, dag
from stages.io import storage
from stages.io.committed import stage_of
from tests import emulator_process
from tests.tiny_run import MIXTURE, TINY, Spec, TinyRun, copy_commits

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# A checkpoint every 3 of the 12 steps, so a kill mid-training has checkpoints to resume from.
CHECKPOINTS = "train.Config.checkpoint_every = 3"
DAGS = {"tiny": TINY.with_params(CHECKPOINTS),                # the one-source tiny DAG
        "mixture": MIXTURE.with_params(CHECKPOINTS)}          # the prose + code tree: nodes like clean[code]
STAGES = list(dag.tree().nodes)     # a one-source run without a reference model
POINTS = ("random", "commit", "gcs")
OUT = os.path.join(REPO, "benchmarks", "out", "faults.json")
TIMEOUT_S = 600         # one run of the pipeline; the whole tiny DAG takes about 20 s
METRIC_FIELDS = ("step", "loss", "accuracy", "grad_norm", "param_norm", "eval_loss")
# Every file a data stage writes, config.gin included, is a function of its key (docs/ARCHITECTURE.md, "The
# stage cache") and is compared byte for byte. Training's and evaluation's outputs hold measurements; of the
# files compared, these differ between two undisturbed runs and are compared without those fields:
#   summary.json   training's throughput (`tokens_per_s`, `mfu`)
#   eval.json      evaluation's throughput (`tokens_per_s`)
TIMED_FILES = ("summary.json", "eval.json")
TIMING_FIELDS = ("tokens_per_s", "mfu")


@dataclasses.dataclass(frozen=True)
class Case:
    """One kill: `point` in POINTS at `stage`, the moment drawn from `random.Random(seed)`.

    `after` (a regex of the run's log) is the line the delay counts from, by default the stage's
    `running <stage> (key …)`; `window_s` the delay's range, by default the stage's undisturbed wall
    time. A fixed `window_s` makes the delay in seconds a function of the seed alone."""

    stage: str
    point: str
    seed: int
    after: str = ""
    window_s: float | None = None

    @property
    def name(self) -> str:
        return f"{self.seed:04d}-{self.stage}-{self.point}"

    @property
    def trigger(self) -> str:
        return self.after or rf"running {re.escape(self.stage)} \(key "


def seeded_case(seed: int, stages: list[str] = STAGES) -> Case:
    """`make faults`' case `seed`: stages cycle fastest, and each round of them shifts the points by one
    (seed = round x stages + i: point (round + i) mod points), so the first len(STAGES) x len(POINTS) seeds
    (CASES_PER_ROUND, `make faults`' default) cover every (stage, point) once, and the first round every stage
    and every point. (The rule was (seed + round) mod points, which for 8 stages and 3 points gave each stage
    one point forever: 9 x round is 0 mod 3.)"""
    rnd, i = divmod(seed, len(stages))
    return Case(stages[i], POINTS[(rnd + i) % len(POINTS)], seed)


CASES_PER_ROUND = len(STAGES) * len(POINTS)


@dataclasses.dataclass
class Result:
    case: Case
    delay_s: float | None     # after the trigger line; None for `commit`
    killed: bool              # the run ended by SIGKILL (a late delay lets it finish first)
    landed: str               # the stage the log said was running when the kill hit ("" if none)
    partial: bool             # the kill left the case's stage uncommitted (it hit inside the stage)
    done_but_partial: list[str]    # stages counted as done after the kill whose files are wrong: must be []
    status_disagrees: list[str]    # stages `pipeline status` reports otherwise than `cache.load`: must be []
    rerun_ok: bool
    differences: list[str]    # the rerun's outputs against the reference's: must be []
    records_lost: int | None  # reference clean documents missing from the rerun's (None: clean not run)
    leftovers: list[str]      # attempts and work/ left after the rerun: must be []
    resumed_from: int | None  # the step a rerun of training resumed from
    kill_s: float
    rerun_s: float
    log_dir: str

    @property
    def ok(self) -> bool:
        return (self.rerun_ok and not (self.done_but_partial or self.status_disagrees or self.differences
                                       or self.records_lost or self.leftovers))

    def to_json(self) -> dict:
        return dataclasses.asdict(self) | {"case": dataclasses.asdict(self.case), "ok": self.ok}


class Harness:
    """Runs cases under `workdir`, against one undisturbed local reference run (made on first use) and,
    for `gcs` cases, one on the emulator (only to time the stages there: uploads make them slower).

    A `gcs` case needs `STORAGE_EMULATOR_HOST` set in this process and `gcs_root` (`gs://bucket`). With
    `shared` (the test session's tiny run), the reference starts from its data half, which has the same keys:
    only its training differs (a checkpoint every 3 steps)."""

    def __init__(self, workdir: str, *, gcs_root: str = "", keep: bool = False,
                 shared: TinyRun | None = None, spec: Spec = DAGS["tiny"]):
        self.workdir, self.gcs_root, self.keep, self.shared, self.spec = workdir, gcs_root, keep, shared, spec
        reference = spec.plan(os.path.join(workdir, "reference"))
        self.keys = {node: sp.key for node, sp in reference.stages.items()}
        self.tree = reference.tree      # a mixture's nodes are clean[code], ...: every name below is a node
        self._reference: dict[str, cache.Committed] = {}
        self._walls: dict[str, dict[str, float]] = {}

    # -- the undisturbed runs -----------------------------------------------------------------------

    def reference(self) -> dict[str, cache.Committed]:
        """The whole DAG, undisturbed, on a local root of its own: what every rerun must equal."""
        if not self._reference:
            root = os.path.join(self.workdir, "reference")
            if self.shared is not None:
                self.shared.copy_to(root)
            out = run_pipeline(command(root, spec=self.spec), self.env(),
                               os.path.join(self.workdir, "reference.log"))
            if out.returncode != 0:
                raise RuntimeError(f"the reference run failed (exit {out.returncode}); see {out.log_path}")
            self._reference = self.committed(root)
            if missing := [s for s, c in self._reference.items() if c is None]:
                raise RuntimeError(f"the reference run left {missing} uncommitted; see {out.log_path}")
            self._walls["local"] = {s: c.manifest["wall_time_s"] for s, c in self._reference.items()}
        return self._reference

    def wall_s(self, stage: str, *, gcs: bool) -> float:
        """The stage's undisturbed wall time (its manifest's `wall_time_s`), on the case's storage."""
        self.reference()
        if not gcs:
            return self._walls["local"][stage]
        walls = self._walls.setdefault("gcs", {})
        if stage not in walls:    # builds the stage once on the emulator, upstream copied from the reference
            root = storage.join(self.gcs_root, "reference")
            copy_commits(root, [self._reference[s] for s in self.tree.closure(stage) if s != stage])
            out = run_pipeline(command(root, stage, spec=self.spec), self.env(gcs=True),
                               os.path.join(self.workdir, f"reference-gcs-{stage}.log"))
            if out.returncode != 0:
                raise RuntimeError(f"the GCS reference run of {stage} failed; see {out.log_path}")
            walls[stage] = self.committed(root)[stage].manifest["wall_time_s"]
        return walls[stage]

    def committed(self, root: str) -> dict[str, cache.Committed | None]:
        return {s: cache.load(root, stage_of(s), key) for s, key in self.keys.items()}

    def env(self, *, gcs: bool = False, kill_before_commit: str = "") -> dict[str, str]:
        env = dict(os.environ, JAX_PLATFORMS="cpu", GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT="false",
                   PYTHONPATH=os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p))
        env.pop(cache.KILL_BEFORE_COMMIT, None)
        if kill_before_commit:
            env[cache.KILL_BEFORE_COMMIT] = kill_before_commit
        if gcs and not (os.environ.get("STORAGE_EMULATOR_HOST") and self.gcs_root):
            raise RuntimeError("a gcs case needs STORAGE_EMULATOR_HOST and Harness(gcs_root='gs://bucket')")
        return env

    # -- one case -----------------------------------------------------------------------------------

    def run(self, case: Case) -> Result:
        """Kill, check, rerun, compare: see the module docstring."""
        reference = self.reference()
        gcs = case.point == "gcs"
        logs = os.path.join(self.workdir, case.name)
        os.makedirs(logs, exist_ok=True)
        root = storage.join(self.gcs_root, case.name) if gcs else os.path.join(logs, "cache")
        copy_commits(root, [reference[s] for s in self.tree.closure(case.stage) if s != case.stage])
        argv = command(root, case.stage, spec=self.spec)
        delay = None
        if case.point == "commit":
            # the cache knows stages, not nodes; upstream being copied, the node is its stage's one instance
            # that runs
            kill = run_pipeline(argv, self.env(kill_before_commit=stage_of(case.stage)),
                                os.path.join(logs, "kill.log"))
        else:
            window = case.window_s if case.window_s is not None else self.wall_s(case.stage, gcs=gcs)
            delay = random.Random(case.seed).random() * window
            kill = run_pipeline(argv, self.env(gcs=gcs), os.path.join(logs, "kill.log"),
                                trigger=re.compile(case.trigger), delay_s=delay)
        killed = kill.returncode == -signal.SIGKILL

        after = self.committed(root)
        done_but_partial = []    # a stage taken as done must be whole: its checksums and content right
        for s, c in after.items():
            if c is not None and (problems := cache.verify(c) + differences(s, reference[s], c)):
                done_but_partial.append(f"{s}: {'; '.join(problems)}")
        try:
            shown = status(command(root, verb="status", spec=self.spec), self.env(gcs=gcs))
            status_disagrees = [f"{s}: status says {shown.get(s)!r}, cache.load {'done' if c else 'not done'}"
                                for s, c in after.items() if (shown.get(s) == "cached") != (c is not None)]
        except RuntimeError as e:      # one case's problem, not the end of a long run of cases
            status_disagrees = [str(e).splitlines()[0] + " " + str(e).splitlines()[-1]]

        rerun = run_pipeline(argv, self.env(gcs=gcs), os.path.join(logs, "rerun.log"))
        final = self.committed(root)
        covered = self.tree.closure(case.stage)
        diffs = [f"{s}: not committed after the rerun" for s in covered if final[s] is None]
        diffs += [d for s in covered if final[s] is not None for d in differences(s, reference[s], final[s])]
        lost = None
        cleans = [n for n in covered if stage_of(n) == "clean"]
        if cleans and all(final[n] is not None for n in cleans):
            lost = sum(len(doc_ids(reference[n]) - doc_ids(final[n])) for n in cleans)
        work = [storage.join(cache.stage_dir(root, stage_of(s), self.keys[s]), cache.WORK) for s in covered]
        leftovers = cache.garbage(root) + [p for p in work if storage.exists(p)]
        resumed = re.findall(r"resumed from step (\d+)", rerun.text)
        result = Result(case, delay, killed, kill.landed, after[case.stage] is None, done_but_partial,
                        status_disagrees, rerun.returncode == 0, diffs, lost, leftovers,
                        int(resumed[-1]) if resumed else None, kill.wall_s, rerun.wall_s, logs)
        with open(os.path.join(logs, "result.json"), "w") as f:
            json.dump(result.to_json(), f, indent=2)
        if result.ok and not self.keep:     # a failed case keeps its cache for a look
            storage.remove(root)
        return result


# ---------------------------------------------------------------------------------------------
# Running the pipeline

def command(root: str, stage: str = "", verb: str = "run", spec: Spec = DAGS["tiny"]) -> list[str]:
    return [sys.executable, "-m", "pipeline", verb, *spec.argv(root), *(["--stage", stage] if stage else [])]


@dataclasses.dataclass
class Output:
    returncode: int
    text: str          # stdout and stderr, interleaved
    landed: str        # the stage running (its last `running <stage>` line) when SIGKILL ended the run
    wall_s: float
    log_path: str


def run_pipeline(argv: list[str], env: dict[str, str], log_path: str, *, trigger: re.Pattern | None = None,
                 delay_s: float = 0.0) -> Output:
    """Runs `argv` in a process group of its own; with `trigger`, SIGKILLs the whole group `delay_s` after
    the first log line matching it (unless the run ended first). The log goes to `log_path`."""
    start = time.monotonic()
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, errors="replace", start_new_session=True)
    lines: list[tuple[float, str]] = []
    seen = threading.Event()
    seen_at = [0.0]

    def read() -> None:
        for line in proc.stdout:
            now = time.monotonic()
            lines.append((now, line))
            if trigger is not None and not seen.is_set() and trigger.search(line):
                seen_at[0] = now
                seen.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    killed_at = None
    try:
        if trigger is not None:
            while not seen.wait(0.02) and not exited(proc) and time.monotonic() - start < TIMEOUT_S:
                pass
            if seen.is_set():
                time.sleep(max(0.0, seen_at[0] + delay_s - time.monotonic()))
                if not exited(proc):
                    os.killpg(proc.pid, signal.SIGKILL)
                    killed_at = time.monotonic()
        while not exited(proc) and time.monotonic() - start < TIMEOUT_S:
            time.sleep(0.05)
    finally:
        # Whatever is left of the group: a run past its timeout, children of a run that killed itself. The
        # leader is not reaped yet, so the group's id cannot have been reused.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        reader.join(timeout=30)
    wall = time.monotonic() - start
    running = [m.group(1) for t, line in lines if killed_at is None or t <= killed_at
               for m in [re.search(r"running ([\w\[\]]+) \(key ", line)] if m]
    landed = running[-1] if running and proc.returncode == -signal.SIGKILL else ""
    text = "".join(line for _, line in lines)
    with open(log_path, "w") as f:
        f.write(f"$ {' '.join(argv)}\n{text}\n[exit {proc.returncode} after {wall:.1f} s"
                + (f", killed by the harness {killed_at - start:.2f} s in" if killed_at else "") + "]\n")
    return Output(proc.returncode, text, landed, wall, log_path)


def exited(proc: subprocess.Popen) -> bool:
    """Whether `proc` has ended, without reaping it: until it is reaped its pid, and so the id of the process
    group it leads, cannot be reused, so killing the group never reaches a stranger."""
    return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def status(argv: list[str], env: dict[str, str]) -> dict[str, str]:
    """node -> its state in `python -m pipeline status` (`argv`): "cached" or "missing"."""
    out = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=TIMEOUT_S)
    if out.returncode != 0:
        raise RuntimeError(f"pipeline status failed (exit {out.returncode}): {out.stderr[-2000:]}")
    rows = [line.split() for line in out.stdout.splitlines()[1:]]
    return {row[0]: row[2] for row in rows if len(row) > 2 and stage_of(row[0]) in dag.STAGES}


# ---------------------------------------------------------------------------------------------
# Comparing with the reference

def differences(stage: str, ref: cache.Committed, got: cache.Committed) -> list[str]:
    """How `got` differs from the reference's commit of the same stage: [] when equal.

    Data stages: the same file names, each file's content equal (after `normalized`). Training: the
    `METRIC_FIELDS` of metrics.jsonl row for row, and summary.json (checkpoints and TensorBoard files carry
    times and random names). Evaluation: eval.json, its loss first (the plots and report.md show
    throughput). Both: config.gin. Equal means equal: a resumed run computes exactly what an undisturbed
    one does."""
    if stage == "train":
        names = ["config.gin", "summary.json"]
        a, b = metrics(ref), metrics(got)
        out = [] if a == b else [f"train metrics.jsonl: {first_difference(a, b)}"]
    elif stage == "evaluate":
        names = ["config.gin", "eval.json"]
        a, b = (storage.read_json(c.file("eval.json"))["loss"] for c in (ref, got))
        out = [] if a == b else [f"evaluate eval.json loss {b!r} != reference {a!r}"]
    else:
        names = sorted(set(ref.files) & set(got.files))
        out = [f"{stage}: files {sorted(set(ref.files) ^ set(got.files))} in only one of the rerun and the "
               "reference"] if set(ref.files) != set(got.files) else []
    for name in names:
        a, b = (normalized(name, storage.read_bytes(c.file(name))) for c in (ref, got))
        if a != b:
            out.append(f"{stage} {name} differs from the reference's{json_difference(a, b)}")
    return out


def json_difference(ref: bytes, got: bytes) -> str:
    """": <field> <got> != reference <ref>" for each top-level field of two JSON objects that differs; "" for
    anything else."""
    try:
        a, b = json.loads(ref), json.loads(got)
    except ValueError:
        return ""
    if not (isinstance(a, dict) and isinstance(b, dict)):
        return ""
    return "".join(f": {k} {b.get(k)!r} != reference {a.get(k)!r}" for k in sorted(set(a) | set(b))
                   if a.get(k) != b.get(k))


def normalized(name: str, data: bytes) -> bytes:
    """`data` without the measurements that legitimately differ between two undisturbed runs (TIMED_FILES)."""
    if posixpath.basename(name) in TIMED_FILES:
        fields = json.loads(data)
        for field in TIMING_FIELDS:
            fields.pop(field, None)
        return json.dumps(fields, sort_keys=True).encode()
    return data


def metrics(done: cache.Committed) -> list[dict]:
    rows = [json.loads(line) for line in storage.read_text(done.file("metrics.jsonl")).splitlines() if line]
    return [{f: r.get(f) for f in METRIC_FIELDS} for r in rows]


def first_difference(ref: list[dict], got: list[dict]) -> str:
    for i, (a, b) in enumerate(zip(ref, got)):
        if a != b:
            return f"row {i + 1}: {b} != reference {a}"
    return f"{len(got)} rows != reference {len(ref)}"


def doc_ids(clean: cache.Committed) -> set[str]:
    import pyarrow.parquet as pq

    ids: set[str] = set()
    for path in clean.paths("*.parquet"):
        ids.update(pq.read_table(io.BytesIO(storage.read_bytes(path)), columns=["id"])["id"].to_pylist())
    return ids


# ---------------------------------------------------------------------------------------------
# The table

COLUMNS = ("stage", "point", "runs", "killed", "in stage", "done but partial", "status agrees",
           "reruns ok", "identical", "records lost", "left over")


LEGEND = """\
killed: runs SIGKILL ended (a late delay lets one finish); in stage: kills that left the stage uncommitted;
done but partial: runs after whose kill a stage counted as done had wrong files (must be 0);
status agrees: with cache.load; identical: reruns whose outputs equal the undisturbed run's;
records lost: reference clean documents missing after the rerun;
left over: attempts and work/ directories after the rerun (must be 0)"""


def summary(results: list[Result]) -> list[dict]:
    """One row per (stage, point) that ran, stages in the order the cases met them (seeded: DAG order), then
    the total."""
    stages = list(dict.fromkeys(r.case.stage for r in results))
    groups = [[r for r in results if (r.case.stage, r.case.point) == (s, p)] for s in stages for p in POINTS]
    rows = [_row(g[0].case.stage, g[0].case.point, g) for g in groups if g]
    return rows + [_row("all", "", results)] if results else rows


def _row(stage: str, point: str, rs: list[Result]) -> dict:
    counts = (len(rs), sum(r.killed for r in rs), sum(r.killed and r.partial for r in rs),
              sum(bool(r.done_but_partial) for r in rs), sum(not r.status_disagrees for r in rs),
              sum(r.rerun_ok for r in rs), sum(r.rerun_ok and not r.differences for r in rs),
              sum(r.records_lost or 0 for r in rs), sum(len(r.leftovers) for r in rs))
    return dict(zip(COLUMNS, (stage, point, *counts)))


def table(results: list[Result]) -> str:
    rows = [COLUMNS] + [tuple(str(v) for v in row.values()) for row in summary(results)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(c.rjust(w) if i > 1 else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))
                     for r in rows)


# ---------------------------------------------------------------------------------------------
# `make faults`

@contextlib.contextmanager
def gcs_emulator():
    """The GCS emulator (tests/gcs_emulator.py) on a free loopback port, with one fresh bucket: yields
    `gs://<bucket>` while `STORAGE_EMULATOR_HOST` points at it (as tests/conftest.py's fixtures do)."""
    with emulator_process.running():
        os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
        bucket = f"faults-{uuid.uuid4().hex[:10]}"
        storage.filesystem(f"gs://{bucket}")[0].mkdir(bucket)
        yield f"gs://{bucket}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.faults.harness", description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=CASES_PER_ROUND,
                   help=f"how many cases ({CASES_PER_ROUND} cover every stage and point once)")
    p.add_argument("--start", type=int, default=0, help="the first seed: cases are seeds START..START+N-1")
    p.add_argument("--out", default=OUT, help="where the JSON goes (default: %(default)s)")
    p.add_argument("--workdir", default="", help="logs and caches (default: a new temporary directory)")
    p.add_argument("--keep", action="store_true", help="keep every case's cache, not only failed ones'")
    p.add_argument("--dag", choices=sorted(DAGS), default="tiny",
                   help="tiny: the one-source tiny DAG; mixture: the prose + code tree, whose per-source "
                        "nodes (clean[code], shard[prose], ...) the cases cycle through")
    args = p.parse_args(argv)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    workdir = args.workdir or tempfile.mkdtemp(prefix="refinery-faults-")
    spec = DAGS[args.dag]
    nodes = list(spec.plan(os.path.join(workdir, "reference")).stages)
    cases = [seeded_case(seed, nodes) for seed in range(args.start, args.start + args.n)]
    start = time.time()
    results = []
    with contextlib.ExitStack() as stack:
        gcs_root = stack.enter_context(gcs_emulator()) if any(c.point == "gcs" for c in cases) else ""
        harness = Harness(workdir, gcs_root=gcs_root, keep=args.keep, spec=spec)
        print(f"reference run in {workdir} ...", flush=True)
        harness.reference()
        for case in cases:
            r = harness.run(case)
            results.append(r)
            delay = "" if r.delay_s is None else f" +{r.delay_s:.2f} s"
            print(f"{case.name}{delay}: {'killed in ' + (r.landed or '?') if r.killed else 'not killed'}"
                  f"{'' if r.killed and r.partial or not r.killed else ' (after its commit)'}, rerun "
                  f"{'ok' if r.rerun_ok else 'FAILED'} in {r.rerun_s:.0f} s"
                  f"{'' if r.resumed_from is None else f', resumed from step {r.resumed_from}'}"
                  f"{'' if r.ok else ' -- PROBLEM: ' + '; '.join(_problems(r)) + f' (logs: {r.log_dir})'}",
                  flush=True)
    print()
    print(table(results))
    print(LEGEND)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"n": args.n, "start": args.start, "wall_s": round(time.time() - start, 1),
                   "workdir": workdir, "table": summary(results), "cases": [r.to_json() for r in results]},
                  f, indent=2)
    print(f"\n{sum(r.ok for r in results)} of {len(results)} cases ok in {time.time() - start:.0f} s; "
          f"JSON: {args.out}; logs: {workdir}")
    if not args.keep:      # the logs stay
        shutil.rmtree(os.path.join(workdir, "reference"), ignore_errors=True)
    return 0 if all(r.ok for r in results) else 1


def _problems(r: Result) -> list[str]:
    return (r.done_but_partial + r.status_disagrees + ([] if r.rerun_ok else ["the rerun failed"])
            + r.differences + ([f"{r.records_lost} records lost"] if r.records_lost else []) + r.leftovers)


if __name__ == "__main__":
    sys.exit(main())
