"""The shard stage's `Config` and its `SPLITS`, re-exported by the package (`shard.Config`).

    shard.Config(tokens_per_shard=100_000_000, val_fraction=0.001, seq_len=8192)

In a module of its own so that the stage's Beam graph (beam_graph.py) imports it without importing the
package, whose `run` imports the graph.
"""

from __future__ import annotations

import dataclasses

from stages import beam_runner

SPLITS = ("train", "val")


@dataclasses.dataclass(frozen=True)
class Config:
    tokens_per_shard: int = 100_000_000     # llm.c's shard size
    # Share of documents (by `split_rule.fraction` of the id) held out for validation. At most the
    # tokenizer's heldout_fraction, so the tokenizer never trained on a validation document (`run` checks;
    # gin/tiny.gin binds both from one macro, VAL_FRACTION).
    val_fraction: float = 0.005
    add_bos: bool = False                   # start every document with bos, not only end it with eos
    docs_per_batch: int = 256               # documents per sentencepiece call
    # The training sequence length: the val split must hold one sequence, seq_len + 1 tokens (the inputs
    # and their shifted targets), or evaluation has nothing to read. The run files bind it and
    # train.Config.seq_len from one macro, SEQ_LEN. allow_small_val=True: a smaller val split only warns.
    seq_len: int = dataclasses.field(default=1024, metadata={"key": False})
    allow_small_val: bool = dataclasses.field(default=False, metadata={"key": False})
    runner: beam_runner.Runner = dataclasses.field(default_factory=beam_runner.Runner,
                                                   metadata={"key": False})

    def __post_init__(self):
        if not 1 <= self.tokens_per_shard <= 2**31 - 1:   # the llm.c header stores the count as int32
            raise ValueError(
                f"shard.Config.tokens_per_shard={self.tokens_per_shard} is not in [1, 2**31 - 1]")
        if not 0.0 <= self.val_fraction < 1.0:
            raise ValueError(f"shard.Config.val_fraction={self.val_fraction} is not in [0, 1)")
        if self.docs_per_batch < 1:
            raise ValueError(f"shard.Config.docs_per_batch={self.docs_per_batch} must be >= 1")
        if self.seq_len < 0:
            raise ValueError(f"shard.Config.seq_len={self.seq_len} must be >= 0 (train.Config.seq_len; "
                             "0 asks for no validation tokens)")

    @property
    def min_val_tokens(self) -> int:
        """Tokens the val split must hold: one training sequence and its last target."""
        return self.seq_len + 1 if self.seq_len else 0
