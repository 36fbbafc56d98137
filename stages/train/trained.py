"""A committed training run's model, rebuilt for scoring: what evaluation and the perplexity stage score with.

    from stages.train import trained
    summary = storage.read_json(train.file("summary.json"))
    net, graphdef, params = trained.restore(train, summary)        # a `model.Transformer` and its parts

Only the parameters of the final checkpoint are read (the optimizer state stays on disk).
"""

from __future__ import annotations

import dataclasses

from flax import nnx

from stages.io import storage
from stages.train import checkpoint, model
from stages.train.model_config import ModelConfig


def restore(train, summary: dict, *, moe_capacity_factor: float | None = 0.0):
    """The trained model, rebuilt from the train summary's model config and its final checkpoint (`train`: a
    committed train output, `stages.io.committed.Committed`). A mixture of experts routes with
    `moe_capacity_factor`: 0 (the default) dropless, every assignment, as the exported model does in
    transformers, vLLM and llama.cpp; a factor drops past each expert's capacity (training's forward pass at
    its own factor); None keeps training's. Returns (net, graphdef, params)."""
    mcfg = ModelConfig.from_json(summary["model"])
    if mcfg.n_experts and moe_capacity_factor is not None:
        mcfg = dataclasses.replace(mcfg, moe_capacity_factor=moe_capacity_factor)
    abstract = nnx.eval_shape(lambda: model.Transformer(mcfg, rngs=nnx.Rngs(0)))
    graphdef, abstract_params = nnx.split(abstract, nnx.Param)
    ckpt = checkpoint.Checkpointer(storage.join(train.path, "checkpoint"), keep=1, every=1, async_save=False)
    state = ckpt.restore(ckpt.latest_step(), {"params": abstract_params}, partial=True)
    params = state["params"]
    ckpt.close()
    return nnx.merge(graphdef, params), graphdef, params
