"""The same-version guard (tests/stage_digests.py): every stage of the session's tiny run writes the digest
recorded for its VERSION in tests/data/stage_digests.json; and what a digest leaves out and how a change is
judged.

    PYTHONPATH=$PWD .venv/bin/python -m pytest -q tests/test_stage_digests.py
    .venv/bin/python -m tests.stage_digests --record       # after a VERSION bump: record the new digests
"""

import json
import os
import warnings

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stages.io import storage
from stages.io.committed import Committed
from tests import stage_digests as sd


def test_every_stage_of_the_tiny_run_writes_what_its_version_recorded(tiny_run):
    report = sd.check(tiny_run.root)
    if report.skipped:
        pytest.skip(report.skipped)
    assert {v.node for v in report.verdicts} == set(tiny_run.spec.plan(tiny_run.root).stages)
    if report.failures:
        pytest.fail(report.message(), pytrace=False)
    for note in report.notes:        # a library's new version, or weights judged on another machine only
        warnings.warn(f"stage digests: {note.node}: {note.text}", stacklevel=1)


def test_a_change_under_the_same_key_fails_naming_the_version_to_bump_and_is_not_recorded(tiny_run, tmp_path):
    """As if clean's code had changed its output without a bump: its recorded digest is not what it writes."""
    table = sd.read_table()
    if table.get("corpus") != sd.corpus():
        pytest.skip(f"digests recorded on {table.get('corpus')}, not {sd.corpus()}")
    for e in table["stages"]["clean"].values():
        e["files"]["stats.json"] = "0" * 16
        e["digest"] = sd.source_hash(e["files"])
    report = sd.check(tiny_run.root, table)
    changed = [v for v in report.failures if v.state == "changed"]
    assert [v.node for v in changed] == ["clean"], report.message()
    assert "(files: stats.json)" in changed[0].text and "in stages/clean/__init__.py" in changed[0].text
    message = report.message()
    assert "Bump the VERSION of each" in message and sd.RECORD in message
    path = tmp_path / "digests.json"
    path.write_text(json.dumps(table))
    with pytest.raises(ValueError, match="refusing to record:\n- clean: digest"):
        sd.record(tiny_run.root, path=str(path))
    sd.record(tiny_run.root, path=str(path), force=True)     # the digest rule changed: recorded anew
    recorded = json.loads(path.read_text())["stages"]["clean"][sd.dag.module("clean").VERSION]
    assert recorded["digest"] == sd.digest_run(tiny_run.root)["clean"].digest
    assert sd.check(tiny_run.root, json.loads(path.read_text())).failures == []


def _commit(path, stage: str, files: dict[str, bytes]) -> Committed:
    for name, data in files.items():
        os.makedirs(os.path.dirname(os.path.join(path, name)), exist_ok=True)
        with open(os.path.join(path, name), "wb") as f:
            f.write(data)
    return Committed(stage, "k", str(path), storage.sizes(str(path)), {})


def _parquet(rows: list[dict], **kwargs) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(pa.Table.from_pylist(rows), sink, **kwargs)
    return sink.getvalue().to_pybytes()


def _outputs(root: str, attempt: str, *, seconds: float, loss: float, text: str, compression: str):
    rows = [{"id": "a", "text": text}, {"id": "b", "text": "two"}]
    report = (f"# Report\n\nModel: `{root}/train/k/{attempt}`\n"
              f"| eval throughput (tokens/s) | {seconds * 7:.0f} |\n| val loss | {loss:.4f} |\n")
    metrics = {"step": 1, "loss": loss, "time": seconds, "tokens_per_s": 9 / seconds}
    return {"docs-00000-of-00001.parquet": _parquet(rows, compression=compression),
            "metrics.jsonl": json.dumps(metrics).encode() + b"\n",
            "report.md": report.encode(), "loss.png": os.urandom(64),
            f"tensorboard/events.out.tfevents.{int(seconds)}.host": os.urandom(32)}


def test_a_digest_leaves_out_what_two_runs_of_one_key_differ_in_and_nothing_else(tmp_path):
    def digest(name, weights=False, **kwargs):
        root = str(tmp_path / name / "cache")
        attempt = f"attempt-20260101T00000{len(name)}-{name}"
        values = {"seconds": 1.5, "loss": 2.25, "text": "one", "compression": "snappy"} | kwargs
        done = _commit(tmp_path / name / "cache" / "x" / "k" / attempt, "x",
                       _outputs(root, attempt, **values))
        return sd.digest(done, root, weights=weights)

    a = digest("a")
    # another cache root, attempt, clock, rate, figure, TensorBoard file and parquet encoding: the same digest
    assert digest("bb", seconds=3.0, compression="zstd") == a
    assert sorted(a.files) == ["docs-00000-of-00001.parquet", "metrics.jsonl", "report.md"]
    parquet = "docs-00000-of-00001.parquet"
    assert digest("c", text="ONE").files[parquet] != a.files[parquet]
    assert digest("d", loss=2.5).digest != a.digest                          # a data stage's number counts
    # a stage reading trained weights: their numbers are left out of `digest`, and kept in `numerics`
    w, other = digest("e", weights=True), digest("f", weights=True, loss=2.5)
    assert w.digest == other.digest and w.numerics_digest != other.numerics_digest
    assert digest("g", weights=True, text="ONE").digest != w.digest


def _entry(got: sd.Digest, stage: str = "clean", **changes) -> dict:
    entry = {"key": "k", "digest": got.digest, "files": got.files, "libraries": sd.libraries(stage)}
    if got.numerics:
        entry["numerics"] = {"machine": sd.machine(), "digest": got.numerics_digest, "files": got.numerics}
    return entry | changes


def test_each_way_an_output_can_differ_from_its_record_is_judged_as_it_should_be():
    got = sd.Digest({"stats.json": "1" * 16}, {})
    assert sd._judge("clean", "5", "k", _entry(got), got) == ("same", "")
    assert sd._judge("clean", "5", "k", None, got)[0] == "unrecorded"
    recorded = _entry(got, upstream={"score": "s"})
    state, text = sd._judge("clean", "5", "k2", recorded, got, {"score": "s"})
    assert (state, text) == ("rekeyed", "recorded under key k, now k2: its config (or what it reads from "
                                        "outside the cache) changed")
    state, text = sd._judge("clean", "5", "k2", recorded, got, {"score": "t"})
    assert text.endswith(": the key of score changed")
    was = sd.Digest({"stats.json": "2" * 16}, {})
    state, text = sd._judge("clean", "5", "k", _entry(was), got)
    assert state == "changed" and "(files: stats.json)" in text and "VERSION '5' in stages/clean/" in text
    numpy = sd.libraries("clean")["numpy"]
    state, text = sd._judge("clean", "5", "k", _entry(was, libraries={"numpy": "0.1"}), got)
    assert state == "libraries" and f"numpy 0.1 -> {numpy}" in text
    # weights' numbers: judged on the machine they were recorded on, noted elsewhere
    trained = sd.Digest({"metrics.jsonl": "1" * 16}, {"metrics.jsonl": "3" * 16})
    before = sd.Digest(trained.files, {"metrics.jsonl": "4" * 16})
    assert sd._judge("train", "5", "k", _entry(before, "train"), trained)[0] == "changed"
    elsewhere = _entry(before, "train")
    other = "x86_64, 64 CPUs, GenuineIntel/6/143, avx512f"
    elsewhere["numerics"] = dict(elsewhere["numerics"], machine=other)
    state, text = sd._judge("train", "5", "k", elsewhere, trained)
    assert state == "same" and "recorded on another machine" in text
    report = sd.Report([sd.Verdict("train", state, text), sd.Verdict("clean", "changed", "x")])
    assert [v.node for v in report.failures] == ["clean"] and [v.node for v in report.notes] == ["train"]


def test_the_weight_nodes_are_training_and_what_reads_its_weights():
    assert sd.weight_nodes(sd.dag.tree()) == ["train", "evaluate", "export"]
    assert "perplexity" in sd.weight_nodes(sd.dag.tree(reference=True))
    assert "clean" in sd.weight_nodes(sd.dag.tree(reference=True))          # it selects by the model's scores


def test_the_table_is_recorded_for_every_stage_of_the_tiny_run():
    """tests/data/stage_digests.json holds a digest for each stage at its VERSION of now (else record)."""
    table = sd.read_table()
    missing = [s for s in sd.dag.tree().nodes
               if sd.dag.module(s).VERSION not in table.get("stages", {}).get(s, {})]
    assert not missing, f"no digest recorded for {missing} at their VERSION: {sd.RECORD}"
