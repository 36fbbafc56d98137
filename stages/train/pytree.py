"""Names of pytree leaves by key path: how checkpoints lay out their nested dicts and how the optimizer
picks parameters by name (weight decay, muon). One namer, so both read a path the same way.

    for path, leaf in jax.tree.flatten_with_path(params)[0]:
        pytree.names(path)       # ["layers", "wq", "value"] for an nnx.State leaf
"""

from __future__ import annotations


def entry_name(entry) -> str:
    """One key-path entry as a string: a dict key, an attribute or field name, or a sequence index."""
    for attr in ("key", "name", "idx"):
        if hasattr(entry, attr):
            return str(getattr(entry, attr))
    return str(entry)


def names(path) -> list[str]:
    return [entry_name(e) for e in path]
