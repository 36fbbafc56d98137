"""The evaluate stage's contamination section: clean's contamination.json, read as a file, for exactly the
yardsticks scored (the yardsticks stage's manifest), and a row saying so for one clean did not check. No
model is trained: the two committed stages are directories of the files evaluate reads.

    .venv/bin/python -m pytest -q -p no:cacheprovider tests/stages/test_evaluate_contamination.py
"""

from __future__ import annotations

import json
import os

from stages import evaluate
from stages.evaluate import report


class Committed:
    """What evaluate reads of a committed stage: its files by name."""

    def __init__(self, path):
        self.path = str(path)

    def file(self, name):
        return os.path.join(self.path, name)


def _found(kind, items, short, hit):
    return {"kind": kind, "items": items, "short_items": short, "items_contaminated": hit,
            "docs_contaminated": hit, "n": 13, "dropped": False, "examples": []}


def test_only_the_scored_yardsticks_are_reported_and_an_unchecked_one_says_so(tmp_path):
    (tmp_path / "clean").mkdir()
    (tmp_path / "yardsticks").mkdir()
    (tmp_path / "clean" / evaluate.CONTAMINATION).write_text(json.dumps({
        "aesop_fables": _found("reference", 53, 0, 0), "hellaswag": _found("task", 10042, 0, 2),
        "piqa": _found("task", 1838, 405, 1)}))
    (tmp_path / "yardsticks" / "manifest.json").write_text(json.dumps({
        "eos_id": 2, "reference": {"aesop_fables": {}, "c4_val": {}}, "tasks": {"piqa": {}, "mmlu": {}}}))
    got = evaluate.contamination(Committed(tmp_path / "clean"), Committed(tmp_path / "yardsticks"))
    assert list(got) == ["aesop_fables", "c4_val", "piqa", "mmlu"]          # what is scored, in its order
    assert got["piqa"]["short_items"] == 405 and got["c4_val"] == got["mmlu"] == {"checked": False}
    table = "\n".join(report.contamination_table({"contamination": got}))
    assert "| piqa | 13 | 1,838 | 405 | 1 | 1 | no |" in table and "| mmlu | not checked |" in table
    assert "hellaswag" not in table                                           # checked, not scored


def test_evaluate_imports_no_data_stage():
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(evaluate))
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    assert not {m for m in imported if m.startswith(("stages.clean", "stages.download", "stages.shard"))}
