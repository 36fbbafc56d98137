"""The held-out / validation rule both the tokenizer and the shard stage apply."""

import pytest

from stages.io import split_rule


def test_the_fraction_is_uniform_and_stable():
    values = [split_rule.fraction(f"id-{i}", "x") for i in range(10_000)]
    assert all(0 <= v < 1 for v in values)
    assert 0.045 < sum(v < 0.05 for v in values) / len(values) < 0.055
    assert split_rule.fraction("abc", "x") == 0xBA7816BF8F01CFEA / 2**64    # sha256("abc")[:8]
    with pytest.raises(ValueError, match="a document in shard.parquet has no id"):
        split_rule.fraction(None, "shard.parquet")
