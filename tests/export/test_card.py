"""The model card names every stage's key, each after the stages it read (download found through clean)."""

from stages.export import card
from stages.io.committed import Committed


def _c(stage, upstream):
    manifest = {"upstream": {u: f"{u}-key" for u in upstream}}
    return Committed(stage, f"{stage}-key", f"/c/{stage}", {}, manifest)


def test_every_stage_key_in_dag_order():
    inputs = {"train": _c("train", ["shard", "yardsticks", "tokenizer"]),
              "tokenizer": _c("tokenizer", ["clean"]),
              "shard": _c("shard", ["clean", "tokenizer"]), "clean": _c("clean", ["download"]),
              "evaluate": _c("evaluate", ["train", "shard", "tokenizer", "yardsticks", "clean"])}
    keys = card.stage_keys(inputs)
    assert set(keys) == {"download", "clean", "tokenizer", "shard", "yardsticks", "train", "evaluate"}
    order = list(keys)
    for stage, committed in inputs.items():
        assert all(order.index(u) < order.index(stage) for u in committed.manifest["upstream"])
    assert keys["download"] == "download-key"
