"""Checkpoints with Orbax: asynchronous saves, the last N kept, exact resume.

    ckpt = checkpoint.Checkpointer(work_dir + "/checkpoints", keep=3, every=1000)
    state = {"params": params, "opt_state": opt_state, "step": jnp.int32(0)}
    if ckpt.latest_step() is not None:                   # resume: restore into the live shardings/dtypes
        state = ckpt.restore(ckpt.latest_step(), state)  # or jax.eval_shape(...) with shardings
    with stop.stop_requests() as requested:              # SIGTERM / Ctrl-C set it (stages/train/stop.py)
        for step in range(start, steps):
            ...
            ckpt.save(step + 1, state)                   # saves when (step + 1) % every == 0
            if requested.is_set():                       # preempted: save now, wait for it, exit
                ckpt.save(step + 1, state, force=True)
                ckpt.wait()
                break
    ckpt.close()                                         # waits for pending saves

`state` is a mapping of names to pytrees of arrays (params, optimizer state, step). Each name is one
Orbax item (`<directory>/<step>/<name>/`), so a reader can restore some of them (`partial=True`).
Inside an item the pytree is stored as nested dicts keyed by its key path (nnx.State, optax
namedtuples and tuples all work); restore rebuilds the structure of the abstract state it is given.
Directories may be local or gs:// (TensorStore writes the arrays; `storage.for_tensorstore` points it at
the GCS emulator when one is set)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import jax
import orbax.checkpoint as ocp

from stages.io import storage
from stages.train import pytree
from stages.train.model_config import LAYER_STACKS

log = logging.getLogger(__name__)


class Checkpointer:
    """Saves and restores training state under `directory` (local or gs://) with an Orbax CheckpointManager.

    keep: how many of the newest checkpoints stay (older ones are deleted after a save).
    every: `save(step, ...)` saves only when step % every == 0, unless forced.
    async_save: saves return once the arrays are copied off the device and write in the background;
        `wait()` blocks until they are on disk.
    """

    def __init__(self, directory: str, *, keep: int = 3, every: int = 1000, async_save: bool = True):
        if keep < 1:
            raise ValueError(f"keep={keep} must be >= 1 (the number of newest checkpoints kept)")
        if every < 1:
            raise ValueError(f"every={every} must be >= 1 (save when step % every == 0)")
        self.directory, self.every = directory, every
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, save_interval_steps=1, create=True,
                                               enable_async_checkpointing=async_save)
        self._manager = ocp.CheckpointManager(storage.for_tensorstore(directory), options=options)
        self._closed = False

    def save(self, step: int, state: Mapping[str, Any], *, force: bool = False) -> bool:
        """Saves `state` as checkpoint `step` when step % every == 0 or `force`; returns whether it saved.

        A step at or before the newest saved one is not saved again (the preemption path may force a
        step the periodic save already wrote). Every process must call this (Orbax coordinates them).
        """
        step = int(step)
        if not (force or step % self.every == 0):
            return False
        latest = self._manager.latest_step()
        if latest is not None and step <= latest:
            if step < latest:
                log.warning("not saving step %d: %s already holds the newer step %d", step, self.directory,
                            latest)
            return False
        items = {name: ocp.args.StandardSave(nested, save_args=_layer_chunks(nested))
                 for name, nested in ((n, _to_nested(t)) for n, t in _items(state).items())}
        saved = self._manager.save(step, args=ocp.args.Composite(**items), force=True)
        log.info("checkpoint step %d -> %s%s", step, self.directory, "" if saved else " (skipped by Orbax)")
        return bool(saved)

    def latest_step(self) -> int | None:
        """The newest finished checkpoint's step, or None when there is none."""
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        return sorted(self._manager.all_steps())

    def delete(self, step: int) -> None:
        """Removes checkpoint `step` (one found damaged), so the next resume does not try it again."""
        self._manager.delete(step)

    def restore(self, step: int | None, abstract_state: Mapping[str, Any], *, partial: bool = False) -> dict:
        """Checkpoint `step` restored into the structure, shapes, dtypes and shardings of `abstract_state`.

        abstract_state: the same mapping `save` was given, with arrays or `jax.ShapeDtypeStruct`s as
        leaves (e.g. `jax.eval_shape(init)` with `.sharding` set); leaves without a sharding land on
        the first local device. partial=True restores only the names in `abstract_state` (say, just
        "params" for evaluation); otherwise its names must match the checkpoint's.
        """
        if step is None or step not in self._manager.all_steps():
            raise FileNotFoundError(f"no checkpoint for step {step} in {self.directory}; it holds steps "
                                    f"{self.all_steps() or 'none'}")
        wanted = _items(abstract_state)
        saved = self._item_names(step)
        missing = sorted(set(wanted) - saved)
        if missing or (not partial and set(wanted) != saved):
            hint = "" if missing else "; pass partial=True to restore a subset"
            raise ValueError(f"checkpoint {self.directory} step {step} holds {sorted(saved)}, the abstract "
                             f"state asks for {sorted(wanted)}{hint}")
        args = {name: ocp.args.StandardRestore(_to_nested(jax.tree.map(_abstract_leaf, tree)))
                for name, tree in wanted.items()}
        restored = self._manager.restore(step, args=ocp.args.Composite(**args))
        return {name: _from_nested(restored[name], tree) for name, tree in wanted.items()}

    def wait(self) -> None:
        """Blocks until every asynchronous save has finished writing."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        """Waits for pending saves and releases Orbax's resources."""
        if self._closed:
            return
        self._closed = True
        self._manager.wait_until_finished()
        self._manager.close()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _item_names(self, step: int) -> set[str]:
        step_dir = self._manager.directory / str(step)   # the default step name format: "<step>"
        return {p.name for p in step_dir.iterdir() if p.is_dir() and not p.name.startswith(("_", "."))}


def _items(state: Mapping[str, Any]) -> dict[str, Any]:
    if not isinstance(state, Mapping) or not all(isinstance(k, str) and k for k in state):
        raise TypeError("checkpoint state must map names to pytrees, like {'params': ..., "
                        f"'opt_state': ..., 'step': ...}}; got {type(state).__name__}")
    return dict(state)


def _to_nested(tree) -> dict:
    """A pytree as nested dicts keyed by its key path: {"0": {"mu": {"kernel": {"value": leaf}}}}."""
    nested: dict = {}
    for path, leaf in jax.tree.flatten_with_path(tree)[0]:
        keys = pytree.names(path) or ["value"]   # a bare array becomes {"value": leaf}
        node = nested
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        if keys[-1] in node:
            raise ValueError(f"two leaves of the checkpoint state share the key path {'/'.join(keys)}")
        node[keys[-1]] = leaf
    return nested


def _layer_chunks(nested: dict, stacked: bool = False):
    """Orbax SaveArgs for `nested`: a leaf under a "layers" or "moe_layers" key (the scanned layers'
    stacked parameters and their optimizer moments, layer axis first) is stored one layer per chunk, so a
    reader of one layer (the export, stages/train/checkpoint_arrays.py) decodes that layer only."""
    if isinstance(nested, Mapping):
        return {k: _layer_chunks(v, stacked or k in LAYER_STACKS) for k, v in nested.items()}
    return ocp.SaveArgs(shard_axes=(0,) if stacked and getattr(nested, "ndim", 0) >= 1 else ())


def _from_nested(nested: Mapping, like):
    """The inverse of `_to_nested`: `like`'s structure with the leaves found in `nested`."""
    paths, treedef = jax.tree.flatten_with_path(like)
    leaves = []
    for path, _ in paths:
        node = nested
        for k in pytree.names(path) or ["value"]:
            node = node[k]
        leaves.append(node)
    return jax.tree.unflatten(treedef, leaves)


def _abstract_leaf(x) -> jax.ShapeDtypeStruct:
    """What to restore a leaf as: its shape, dtype and sharding (the first local device when it has none)."""
    sharding = getattr(x, "sharding", None)
    if sharding is None:
        sharding = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)
