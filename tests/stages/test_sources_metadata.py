"""Sources beyond plain text: field paths into nested records, the `metadata` column carried from download
through clean to its report, FineWeb's columns and its pinned hub revision (a fake hub, no network), and
instruction-tuning records rendered through templates, with every reason a record cannot be."""

import datetime
import decimal
import hashlib
import json
import os
import uuid

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fsspec.implementations.dirfs import DirFileSystem

import stages.clean
from pipeline import cache, config
from stages import download
from stages.clean import report
from stages.download import Files, FineWeb, document, formats, templates
from stages.io import documents, storage
from tests.conftest import REPO


def _run(root, source, **kw):
    committed = cache.run_stage(cache_root=str(root), stage="download", key="k",
                                config=download.Config(source=source, num_shards=1, **kw), upstream={},
                                fn=download.run)
    docs = [d for p in documents.shards_of(committed) for d in documents.read(p)]
    return committed, docs, storage.read_json(committed.file("stats.json"))


def _jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def _read(path, **fields):
    return list(formats.read(path, 0, formats.Fields(**fields)))


# ---------------------------------------------------------------------------------------------
# Field paths and metadata

DOLMA = [
    {"id": "d1", "text": "first page", "source": "cc", "added": "2024-01-01",
     "metadata": {"url": "https://a.example/1", "lang": {"en": 0.98}, "warc": "x.warc.gz"}},
    {"id": "d2", "text": "second page", "metadata": {"url": "https://a.example/2"}},  # url only: no {} left
    {"id": "d3", "text": "third page", "metadata": {"lang": "en"}},                   # no url: positional
    {"id": "d4", "text": "fourth page", "metadata": {"url": 17}},                     # non-string url: kept
    {"id": "d5", "body": {"text": "nested text"}, "metadata": "not an object"},
]


def test_nested_paths_find_present_fields_and_fall_back_or_count_the_missing(tmp_path):
    path = _jsonl(tmp_path / "dolma.jsonl", DOLMA)
    docs = _read(path, id="id", url="metadata.url")
    meta = [json.loads(d["metadata"]) if d["metadata"] else None for d in docs]
    assert [d["url"] for d in docs] == ["https://a.example/1", "https://a.example/2", f"{path}:3", "17",
                                        f"{path}:5"]
    assert [d["id"] for d in docs] == ["d1", "d2", "d3", "d4", "d5"]
    assert meta[0] == {"source": "cc", "added": "2024-01-01", "metadata": {"lang": {"en": 0.98},
                                                                           "warc": "x.warc.gz"}}
    assert meta[1] is None                                          # every field was taken
    assert meta[2] == {"metadata": {"lang": "en"}}
    assert docs[4]["error"] == "missing_text" and meta[4] == {"body": {"text": "nested text"},
                                                              "metadata": "not an object"}

    docs = _read(path, text="body.text", url="metadata.url.deeper")  # a path through a non-object: missing
    assert [d["error"] for d in docs] == ["missing_text"] * 4 + [None]
    assert docs[4]["text"] == "nested text" and docs[4]["url"] == f"{path}:5"
    assert json.loads(docs[4]["metadata"]) == {"id": "d5", "metadata": "not an object"}

    docs = _read(path, text="metadata")                             # an object, a string: non-string text
    assert [d["error"] for d in docs] == ["non_string_text"] * 4 + [None]
    assert docs[4]["text"] == "not an object"


def test_a_key_with_a_dot_is_found_whole_and_metadata_fields_choose(tmp_path):
    path = _jsonl(tmp_path / "a.jsonl", [{"text": "t", "warc.date": "2019", "a": {"b": 1, "c": 2}, "z": 0}])
    assert document.field({"a.b": 1, "a": {"b": 2}}, "a.b") == 1
    assert json.loads(_read(path)[0]["metadata"]) == {"warc.date": "2019", "a": {"b": 1, "c": 2}, "z": 0}
    assert _read(path, metadata=())[0]["metadata"] is None
    chosen = _read(path, metadata=("warc.date", "a.c", "missing"))[0]["metadata"]
    assert json.loads(chosen) == {"warc.date": "2019", "a.c": 2}


def test_values_json_cannot_hold_are_converted_the_same_way_every_time():
    when = datetime.datetime(2024, 2, 21, 12, 30, tzinfo=datetime.UTC)
    value = {"b": b"bytes", "raw": b"\xff\x00", "when": when, "day": datetime.date(2024, 2, 21),
             "took": datetime.timedelta(seconds=1.5), "price": decimal.Decimal("1.10"), "n": np.int64(7),
             "x": np.float32(0.5), "arr": np.arange(3), "nan": float("nan"), "inf": -float("inf"),
             "set": {3, 1, 2}, "tuple": (1, "a"), 5: "int key", "obj": uuid.UUID(int=1)}
    out = json.loads(document.metadata_json(value))
    assert out == {"b": "bytes", "raw": "base64:/wA=", "when": "2024-02-21T12:30:00+00:00",
                   "day": "2024-02-21", "took": 1.5, "price": "1.10", "n": 7, "x": 0.5, "arr": [0, 1, 2],
                   "nan": "NaN", "inf": "-Infinity", "set": [1, 2, 3], "tuple": [1, "a"], "5": "int key",
                   "obj": "00000000-0000-0000-0000-000000000001"}
    assert document.metadata_json(value) == document.metadata_json(dict(reversed(value.items())))
    assert document.metadata_json({}) is None and document.metadata_json(None) is None
    assert document.metadata_json({"s": "lone \ud800"}) == '{"s": "lone \\ud800"}'   # storable in parquet


def test_parquet_structs_and_typed_columns_become_metadata(tmp_path):
    when = datetime.datetime(2024, 1, 2, 3, 4, 5)
    pq.write_table(pa.table({
        "content": [{"text": "nested", "lang": "en"}, {"text": None, "lang": "fr"}],
        "meta": [{"url": "https://p.example/0"}, {"url": None}],
        "when": pa.array([when, when], pa.timestamp("us")),
        "blob": [b"\xff\x01", b"ok"],
        "score": [0.5, 0.25]}), tmp_path / "p.parquet")
    source = Files(paths=(str(tmp_path / "*.parquet"),), text_field="content.text", url_field="meta.url")
    assert source.units() == [(str(tmp_path / "p.parquet"), 0)]   # the struct column counts as the text's
    docs = list(source.read(source.units()[0]))
    assert [(d["text"], d["error"], d["url"]) for d in docs] == [
        ("nested", None, "https://p.example/0"), (None, "missing_text", f"{tmp_path}/p.parquet:1")]
    assert json.loads(docs[0]["metadata"]) == {"content": {"lang": "en"}, "when": "2024-01-02T03:04:05",
                                               "blob": "base64:/wE=", "score": 0.5}
    assert json.loads(docs[1]["metadata"])["meta"] == {"url": None}   # not taken: null, so kept as it is
    only = Files(paths=(str(tmp_path / "*.parquet"),), text_field="content.text", metadata_fields=["score"])
    assert only.metadata_fields == ("score",)
    metadata = [json.loads(d["metadata"]) for d in only.read(only.units()[0])]
    assert metadata == [{"score": 0.5}, {"score": 0.25}]


def test_metadata_goes_through_clean_with_language_id_merged_and_into_the_report(tmp_path):
    english = "The committee met on Tuesday to discuss the new library budget and the park repairs. " * 4
    records = [{"text": english, "id": "keep", "metadata": {"url": "https://k.example", "dump": "CC-1"},
                "score": 3},
               {"text": "too short", "id": "short", "metadata": {"dump": "CC-2"}, "score": 1}]
    source = Files(paths=(_jsonl(tmp_path / "in.jsonl", records),), id_field="id", url_field="metadata.url")
    downloaded, docs, _ = _run(tmp_path / "cache", source)
    assert json.loads(docs[0]["metadata"]) == {"metadata": {"dump": "CC-1"}, "score": 3}

    out = tmp_path / "clean"
    cleaning = stages.clean.Config(min_chars=100, language_id=stages.clean.langid.LanguageID(), num_shards=1)
    stages.clean.run(cleaning, {"download": downloaded}, str(out), str(tmp_path / "work"))
    kept = [d for p in sorted(out.glob("docs-*.parquet")) for d in documents.read(str(p))]
    assert [d["id"] for d in kept] == ["keep"]
    meta = json.loads(kept[0]["metadata"])
    assert meta.pop("language") == "en" and meta.pop("language_score") > 0.65
    assert meta == {"metadata": {"dump": "CC-1"}, "score": 3}   # the source's fields, unchanged

    assert report.metadata_summary(docs[1]["metadata"]) == 'metadata={"dump": "CC-2"}, score=1'
    summary = report.metadata_summary('{"a": 1, "b": "x", "c": 3, "d": 4, "e": 5}')
    assert summary == "a=1, b=x, c=3, d=4, +1 more"
    assert report.metadata_summary(None) == "" and report.metadata_summary("[1]") == ""
    assert report.metadata_summary({"long": "y" * 100}) == f"long={'y' * 40}…"


# ---------------------------------------------------------------------------------------------
# FineWeb: its columns, and the hub revision pinned

FINEWEB_COLUMNS = {"dump": "CC-MAIN-2024-10", "date": "2024-02-21T00:00:00Z",
                   "file_path": "s3://commoncrawl/x.warc.gz", "language": "en", "language_score": 0.91,
                   "token_count": 42}


def _fineweb_file(path, texts):
    n = len(texts)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"text": texts, "id": [f"<urn:{t}>" for t in texts],
                             "url": [f"https://{i}.example" for i in range(n)],
                             **{k: [v] * n for k, v in FINEWEB_COLUMNS.items()}}), path)


def test_fineweb_keeps_its_metadata_columns(tmp_path):
    _fineweb_file(tmp_path / "sample/10BT/000.parquet", ["page a", "page b"])
    _, docs, _ = _run(tmp_path / "cache", FineWeb(root=str(tmp_path)))
    assert [json.loads(d["metadata"]) for d in docs] == [FINEWEB_COLUMNS] * 2
    assert docs[0]["source"] == "fineweb/CC-MAIN-2024-10" and docs[0]["id"] == "<urn:page a>"
    _, docs, _ = _run(tmp_path / "some", FineWeb(root=str(tmp_path), metadata_fields=("dump", "token_count")))
    assert json.loads(docs[0]["metadata"]) == {"dump": "CC-MAIN-2024-10", "token_count": 42}
    _, docs, stats = _run(tmp_path / "none", FineWeb(root=str(tmp_path), metadata_fields=()))
    assert docs[0]["metadata"] is None and "revision" not in stats   # a local copy has no revision


COMMIT, LATER = "a" * 40, "b" * 40


class FakeHub(DirFileSystem):
    """hf:// served from a local folder (`datasets/<owner>/<name>@<commit>/...` per commit), with the git
    blob id the real hub's listing gives."""

    protocol = "hf"

    def __init__(self, root):
        super().__init__(path=root, fs=fsspec.filesystem("file"))

    def glob(self, path, **kwargs):
        found = super().glob(path, **kwargs)
        if kwargs.get("detail"):
            for name, info in found.items():
                data = self.cat_file(name)
                info["blob_id"] = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
        return found


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """A fake hub holding FineWeb at two commits (main moves from COMMIT to LATER); returns the calls made
    to resolve a revision."""
    import huggingface_hub

    repo = tmp_path / "hub/datasets/HuggingFaceFW"
    _fineweb_file(repo / f"fineweb@{COMMIT}/sample/10BT/000.parquet", ["old 0", "old 1"])
    _fineweb_file(repo / f"fineweb@{COMMIT}/README.md", ["x"])
    _fineweb_file(repo / f"fineweb@{LATER}/sample/10BT/000.parquet", ["new 0", "new 1", "new 2"])
    fake, real = FakeHub(str(tmp_path / "hub")), fsspec.filesystem
    monkeypatch.setattr(fsspec, "filesystem",
                        lambda protocol, **kw: fake if protocol == "hf" else real(protocol, **kw))
    calls, heads = [], {"main": COMMIT}

    def repo_info(self, repo_id, *, revision=None, repo_type=None, **kw):
        calls.append((repo_id, repo_type, revision))
        if heads.get("offline"):
            raise ConnectionError("Failed to resolve 'huggingface.co'")
        return type("Info", (), {"sha": heads.get(revision, revision)})()

    monkeypatch.setattr(huggingface_hub.HfApi, "repo_info", repo_info)
    return calls, heads


def test_fineweb_on_the_hub_reads_the_commit_it_resolved_and_records_it(tmp_path, hub):
    calls, heads = hub
    source = FineWeb()                                         # hf://datasets/HuggingFaceFW/fineweb at main
    fingerprint = source.fingerprint()
    assert list(fingerprint) == ["hf://datasets/HuggingFaceFW/fineweb/sample/10BT/000.parquet"]
    assert fingerprint[next(iter(fingerprint))].startswith("blob_id=")
    heads["main"] = LATER                                      # a push after planning...
    units = source.units()                                     # ...is not seen by this config
    assert units == [(f"hf://datasets/HuggingFaceFW/fineweb@{COMMIT}/sample/10BT/000.parquet", 0)]
    assert calls == [("HuggingFaceFW/fineweb", "dataset", "main")]   # resolved once

    _, docs, stats = _run(tmp_path / "cache", source)
    assert [d["text"] for d in docs] == ["old 0", "old 1"] and stats["revision"] == COMMIT
    assert json.loads(docs[0]["metadata"]) == FINEWEB_COLUMNS

    _, docs, stats = _run(tmp_path / "later", FineWeb())       # a new config resolves main again
    assert [d["text"] for d in docs] == ["new 0", "new 1", "new 2"] and stats["revision"] == LATER
    assert FineWeb().fingerprint() != fingerprint              # the file changed
    assert FineWeb(revision=COMMIT).units() == units           # a pinned commit in gin
    committed = cache.load(str(tmp_path / "later"), "download", "k")
    assert download.summary(committed).endswith(f"; hub revision {LATER[:12]}")


def test_fineweb_key_ignores_commits_that_leave_its_files_alone_and_offline_is_a_clear_error(tmp_path, hub):
    calls, heads = hub
    plan = config.load([f"{REPO}/gin/tiny.gin", f"{REPO}/gin/data/fineweb.gin"])
    first = plan.stages["download"].key
    heads["main"] = "c" * 40                                   # a commit that changed only the README
    os.symlink(tmp_path / f"hub/datasets/HuggingFaceFW/fineweb@{COMMIT}",
               tmp_path / f"hub/datasets/HuggingFaceFW/fineweb@{'c' * 40}")
    plan = config.load([f"{REPO}/gin/tiny.gin", f"{REPO}/gin/data/fineweb.gin"])
    assert plan.stages["download"].key == first

    heads["offline"] = True
    plan = config.load([f"{REPO}/gin/tiny.gin", f"{REPO}/gin/data/fineweb.gin"])
    with pytest.raises(config.InputsError, match=r"download: cannot list what it reads.*Failed to resolve "
                                                 r"'huggingface.co'"):
        _ = plan.stages["download"].key


@pytest.mark.parametrize("make, message", [
    (lambda: FineWeb(root="/data/fineweb", revision="v1"), "FineWeb.revision='v1' needs a root on the hub"),
    (lambda: FineWeb(revision=""), "FineWeb.revision is empty"),
    (lambda: FineWeb(metadata_fields=("*", "dump")), "FineWeb.metadata_fields=('*', 'dump') must be"),
    (lambda: Files(paths=("x",), template="jinja"),
     "Files.template='jinja' is not one of 'alpaca', 'chatml'"),
    (lambda: Files(paths=("x",), template="{instruction} {answer}"), "it uses ['answer']"),
    (lambda: Files(paths=("x",), template="{instruction"), "write a literal brace as {{ or }}"),
    (lambda: Files(paths=("x",), template="alpaca", message_formats={"user": "{text}"}),
     "Files.message_formats['user']='{text}' is not a format string over {role}, {content}"),
    (lambda: Files(paths=("x",), message_formats={"user": "{content}"}), "Files.template is empty"),
    (lambda: storage.hub_commit("hf://datasets/HuggingFaceFW/fineweb@main"), "give the revision separately"),
])
def test_bad_values_are_named(make, message):
    with pytest.raises(ValueError) as e:
        make()
    assert message in str(e.value)


# ---------------------------------------------------------------------------------------------
# Instruction tuning

SFT = [
    {"instruction": "Name a colour.", "output": "Blue.", "id": "i1", "category": "open_qa"},
    {"instruction": "Add the numbers.", "input": "2 and 3", "output": "5"},
    {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                  {"role": "assistant", "content": "Hello."}]},
    {"prompt": "no instruction"},                                              # missing_instruction
    {"instruction": "No answer."},                                             # missing_output
    {"instruction": "Odd.", "output": 5},                                      # non_string_field
    {"instruction": ["a"], "output": "b"},                                     # non_string_field
    {"messages": []},                                                          # malformed_messages
    {"messages": [{"role": "user"}]},                                          # malformed_messages
    {"messages": "hello"},                                                     # malformed_messages
    {"messages": [{"role": "tool", "content": "42"}]},                         # unknown_role (alpaca)
]
REASONS = [None, None, None, "missing_instruction", "missing_output", "non_string_field", "non_string_field",
           "malformed_messages", "malformed_messages", "malformed_messages", "unknown_role"]


def test_alpaca_renders_both_prompts_and_chats_and_counts_every_failure(tmp_path):
    source = Files(paths=(_jsonl(tmp_path / "sft.jsonl", SFT),), template="alpaca", id_field="id")
    _, docs, stats = _run(tmp_path / "cache", source, min_docs=3)
    assert [d["error"] for d in docs] == REASONS
    assert docs[0]["text"] == templates.ALPACA_NO_INPUT.format(instruction="Name a colour.", output="Blue.")
    assert docs[0]["text"].endswith("### Instruction:\nName a colour.\n\n### Response:\nBlue.")
    assert docs[1]["text"].endswith("### Input:\n2 and 3\n\n### Response:\n5")
    assert docs[2]["text"] == "Be brief.\n\n### Instruction:\nHi\n\n### Response:\nHello.\n\n"
    assert docs[0]["id"] == "i1" and json.loads(docs[0]["metadata"]) == {"category": "open_qa"}
    assert docs[3]["metadata"] == '{"prompt": "no instruction"}'
    assert stats["errors"] == {"missing_instruction": 1, "missing_output": 1, "non_string_field": 2,
                               "malformed_messages": 3, "unknown_role": 1}


def test_chatml_renders_any_role_and_instruction_records_as_a_chat(tmp_path):
    path = _jsonl(tmp_path / "sft.jsonl", SFT)
    docs = list(Files(paths=(path,), template="chatml").read((path, 0)))
    assert [d["error"] for d in docs] == REASONS[:-1] + [None]
    assert docs[1]["text"] == ("<|im_start|>user\nAdd the numbers.\n\n2 and 3<|im_end|>\n"
                               "<|im_start|>assistant\n5<|im_end|>\n")
    assert docs[2]["text"].startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi")
    assert docs[10]["text"] == "<|im_start|>tool\n42<|im_end|>\n"


def test_a_custom_template_and_per_role_formats(tmp_path):
    path = _jsonl(tmp_path / "sft.jsonl", SFT)
    custom = Files(paths=(path,), template="Q: {instruction} {input}\nA: {output}",
                   message_formats={"user": "U: {content}\n", "assistant": "A: {content}\n"})
    assert custom.message_formats == (("assistant", "A: {content}\n"), ("user", "U: {content}\n"))
    docs = list(custom.read((path, 0)))
    assert docs[0]["text"] == "Q: Name a colour. \nA: Blue."
    assert docs[1]["text"] == "Q: Add the numbers. 2 and 3\nA: 5"
    assert docs[2]["error"] == "unknown_role"                  # no format for "system", and no "*"
    with_any = Files(paths=(path,), template="{instruction}={output}",
                     message_formats={"*": "[{role}] {content}\n"})
    assert list(with_any.read((path, 0)))[2]["text"] == "[system] Be brief.\n[user] Hi\n[assistant] Hello.\n"
    assert list(Files(paths=(path,), template="{output}").read((path, 0)))[2]["error"] == "unknown_role"


def test_sft_parquet_needs_no_text_column(tmp_path):
    pq.write_table(pa.table({"instruction": ["Say hi."], "output": ["hi"]}), tmp_path / "s.parquet")
    source = Files(paths=(str(tmp_path / "s.parquet"),), template="{instruction} -> {output}")
    assert [d["text"] for d in source.read(source.units()[0])] == ["Say hi. -> hi"]


def test_gin_binds_the_new_settings_and_the_sft_example_loads(tmp_path):
    plan = config.load([f"{REPO}/gin/tiny.gin"], [
        "download.Config.source = @download.Files()", f'download.Files.paths = ["{tmp_path}/*.jsonl"]',
        'download.Files.url_field = "metadata.url"', 'download.Files.metadata_fields = ["source", "added"]',
        'download.Files.template = "chatml"', 'download.Files.message_formats = {"user": "> {content}"}',
        'download.FineWeb.revision = "v1.2.0"'])
    source = plan.stages["download"].config.source
    assert (source.url_field, source.metadata_fields, source.template, source.message_formats) == (
        "metadata.url", ("source", "added"), "chatml", (("user", "> {content}"),))
    plan = config.load([f"{REPO}/gin/tiny.gin", f"{REPO}/gin/data/sft.gin"])
    assert plan.stages["download"].config.source.template == "chatml"
    assert config.placeholders(plan) == ["download.Files.paths = 'YOUR_DATA/sft/*.jsonl.gz'"]
