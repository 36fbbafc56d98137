"""The document parquet schema and the one parquet row reader."""

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline import cache
from stages.io import documents, storage


def test_rows_of_the_whole_file_or_one_row_group_keep_their_file_index(tmp_path):
    path = str(tmp_path / "x.parquet")
    table = pa.table({"text": [f"t{i}" for i in range(10)], "extra": list(range(10))})
    pq.write_table(table, path, row_group_size=4)                       # row groups of 4, 4, 2
    assert [r for r, _ in documents.rows(path, ["text"])] == list(range(10))
    assert list(documents.rows(path, ["text", "url"], row_group=1)) == [
        (i, {"text": f"t{i}", "url": None}) for i in range(4, 8)]       # a missing column reads as None


def test_written_shards_read_back_and_name_themselves(tmp_path):
    docs = [{"id": f"d{i}", "text": "x" * i, "url": None, "source": "s"} for i in range(5000)]
    path = str(tmp_path / documents.shard_name(0, 1))
    assert documents.write(path, docs) == 5000
    assert [d["id"] for d in documents.read(path, columns=("id",))] == [d["id"] for d in docs]
    assert next(documents.read(path)) == docs[0] | {"error": None, "metadata": None}


def test_a_stage_that_lists_no_document_shards_is_named(tmp_path):
    def write_stats_only(config, inputs, out_dir, work_dir):
        storage.write_json(storage.join(out_dir, "stats.json"), {})

    done = cache.run_stage(cache_root=str(tmp_path), stage="download", key="k", config={}, upstream={},
                           fn=write_stats_only)
    with pytest.raises(FileNotFoundError, match=r"download output .*attempt-.* lists no docs-\*.parquet"):
        documents.shards_of(done)
