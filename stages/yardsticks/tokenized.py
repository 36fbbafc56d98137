"""The yardsticks stage's files: writing them (from text) and reading them back (for scoring).

    from stages.yardsticks import tokenized
    y = tokenized.load(committed_yardsticks)                  # everything: what the evaluate stage scores
    y = tokenized.load(committed_yardsticks, in_loop=True)    # the subset training scores every eval_every
    y.reference["aesop_fables"]    # [Document(id, bytes, ids)]
    y.tasks["piqa"]                # [Item(id, gold, chars, requests)]

JSON lines, one document or item per line (the stage's docstring gives the fields). No JAX here.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence

from stages.io import storage

REFERENCE, TASKS, MANIFEST = "reference.jsonl", "tasks.jsonl", "manifest.json"


@dataclasses.dataclass(frozen=True)
class Document:
    id: str
    bytes: int                       # UTF-8 bytes of the text
    ids: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Item:
    """A task item, tokenized: what `task_metrics.score_task` reads (id, gold, choices, scored_chars)."""

    id: str
    gold: int
    chars: tuple[int, ...]                                      # per choice: acc_norm's divisor
    requests: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]   # per choice: (context, continuation)

    @property
    def choices(self) -> tuple[int, ...]:
        return self.chars

    def scored_chars(self) -> tuple[int, ...]:
        return self.chars


@dataclasses.dataclass(frozen=True)
class Yardsticks:
    reference: dict[str, list[Document]]
    tasks: dict[str, list[Item]]
    eos_id: int

    def __bool__(self) -> bool:
        return any(self.reference.values()) or any(self.tasks.values())


def load(committed, *, in_loop: bool = False) -> Yardsticks:
    """The committed yardsticks stage's documents and items (those marked in_loop only, with `in_loop`)."""
    manifest = storage.read_json(committed.file(MANIFEST))
    reference: dict[str, list[Document]] = {name: [] for name in manifest["reference"]}
    for row in _rows(committed.file(REFERENCE)):
        if row["in_loop"] or not in_loop:
            reference[row["set"]].append(Document(row["id"], row["bytes"], tuple(row["ids"])))
    tasks: dict[str, list[Item]] = {name: [] for name in manifest["tasks"]}
    for row in _rows(committed.file(TASKS)):
        if row["in_loop"] or not in_loop:
            tasks[row["task"]].append(Item(row["id"], row["gold"], tuple(row["chars"]),
                                           tuple((tuple(c), tuple(k)) for c, k in row["requests"])))
    return Yardsticks({k: v for k, v in reference.items() if v}, {k: v for k, v in tasks.items() if v},
                      manifest["eos_id"])


def reference_rows(name: str, documents: Sequence[tuple[str, str]], encode: Callable[[str], list[int]],
                   in_loop_docs: int) -> list[dict]:
    """One row per (id, text) document of reference set `name`; the first `in_loop_docs` (0: all) are
    scored in the training loop."""
    empty = [doc_id for doc_id, text in documents if not text]
    if empty:
        raise ValueError(f"reference set {name}: documents {empty[:5]} have no text")
    return [{"set": name, "id": str(doc_id), "bytes": len(text.encode("utf-8")), "ids": encode(text),
             "in_loop": not in_loop_docs or i < in_loop_docs}
            for i, (doc_id, text) in enumerate(documents)]


def task_rows(items, sp, eos_id: int, in_loop_items: int) -> list[dict]:
    """One row per `tasks.Item` (`tokenize`d); the first `in_loop_items` are scored in the training loop."""
    rows = []
    for i, (item, tokens) in enumerate(zip(items, tokenize(items, sp, eos_id))):
        rows.append({"task": item.task, "id": tokens.id, "gold": tokens.gold, "chars": list(tokens.chars),
                     "requests": [[list(c), list(k)] for c, k in tokens.requests],
                     "in_loop": i < in_loop_items})
    return rows


def tokenize(items, sp, eos_id: int) -> list[Item]:
    """Text items (`tasks.Item`) -> tokenized ones: each choice's request as ids (`request_ids`)."""
    return [Item(item.id, item.gold, tuple(item.scored_chars()),
                 tuple(tuple(map(tuple, request_ids(sp, context, continuation, eos_id)))
                       for context, continuation in item.requests()))
            for item in items]


def request_ids(sp, context: str, continuation: str, eos_id: int) -> tuple[list[int], list[int]]:
    """(context ids, continuation ids) of one request, as lm-eval splits them: whitespace that ends the
    context moves to the front of the continuation, context + continuation is encoded whole, and the
    continuation is what follows the context's own encoding. The context is prefixed with `eos_id`: a task's
    text starts a document, as every document in training follows an EOS.

    Sentencepiece adds a dummy "▁" before a text and writes a word's space into its first piece, so a
    continuation that starts with a space (every task's choices: " Paris") encodes to the same ids whole or
    alone ("▁Paris"), and those ids are exactly its own. Where the boundary falls inside a piece (a
    continuation with no leading space that merges with the context's last characters), the split is at the
    longest prefix the whole encoding shares with the context's: that merged piece is scored as part of the
    continuation, never dropped.
    """
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    whole = sp.encode(context + continuation)
    alone = sp.encode(context)
    shared = 0
    while shared < min(len(whole), len(alone)) and whole[shared] == alone[shared]:
        shared += 1
    return [eos_id] + whole[:shared], whole[shared:]


def jsonl(rows: list[dict]) -> str:
    return "".join(json.dumps(row, separators=(",", ":")) + "\n" for row in rows)


def _rows(path: str) -> list[dict]:
    return [json.loads(line) for line in storage.read_text(path).splitlines() if line]
