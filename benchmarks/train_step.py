"""One training step of the model in a gin file: compiled memory per remat policy, and tokens/s + MFU.

    .venv/bin/python -m benchmarks train_step       # writes benchmarks/out/train_step.json, prints the table

The model comes from `gin/tiny.gin` (CPU) or, on a GPU/TPU, `gin/tiny.gin` + `gin/model/124m.gin` at
T = 1024, exactly as the training stage would build it, with the tokenizer's vocabulary replaced by the
model file's. Per remat policy: `temp_mib`, XLA's compiled scratch of the jitted train step
(`memory_analysis().temp_size_in_bytes`) and its ratio to `none`. For `none` (the baseline) and `full`:
the median step time over `repeats` steps after a warm-up, tokens/s, and MFU against the device's peak
(`stages.train.planning.devices.DEVICES`); `full_time_ratio` is what full remat costs in time.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import statistics
import time

import jax
import numpy as np
from flax import nnx

from pipeline import config
from stages.train import loop, metrics, model, model_config, optimizer
from stages.train.step import train_step

GIN = os.path.join(config.GIN_DIR, "tiny.gin")
TIMED = ("none", "full")


def measure(work_dir: str, repeats: int = 5) -> dict:
    del work_dir
    accelerator = jax.default_backend() != "cpu"
    files = [GIN] + ([os.path.join(config.GIN_DIR, "model", "124m.gin")] if accelerator else [])
    params = ["train.Config.seq_len = 1024", "train.Config.global_batch = 16"] if accelerator else []
    cfg = config.load(files, params).stages["train"].config
    cfg = dataclasses.replace(cfg, optimizer=cfg.optimizer_for_run())
    tokens = np.random.default_rng(0).integers(2, cfg.model.vocab_size, (cfg.global_batch, cfg.seq_len + 1),
                                               dtype=np.int32)
    peak_name, peak = metrics.published_peak_flops(jax.devices()[0])   # peak None: a CPU (no MFU)
    result = {"benchmark": "train_step", "backend": jax.default_backend(), "device": peak_name,
              "model": os.path.basename(files[-1]), "params": model.num_params(cfg.model),
              "batch": cfg.global_batch, "seq_len": cfg.seq_len, "dtype": cfg.model.dtype}
    for remat in model_config.REMAT_NAMES:
        c = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, remat=remat))
        graphdef, state = nnx.split(model.Transformer(c.model, rngs=nnx.Rngs(0)), nnx.Param)
        tx = optimizer.make_optimizer(c.optimizer, state)
        opt_state = tx.init(state)
        step = jax.jit(functools.partial(train_step, graphdef, tx, **loop.step_options(c, 1)))
        compiled = step.lower(state, opt_state, tokens).compile()
        result[f"{remat}_temp_mib"] = round(compiled.memory_analysis().temp_size_in_bytes / 2**20, 2)
        if remat in TIMED:
            seconds = _time(compiled, state, opt_state, tokens, repeats)
            tps = cfg.global_batch * cfg.seq_len / seconds
            result[f"{remat}_step_s"] = round(seconds, 4)
            result[f"{remat}_tokens_per_s"] = round(tps, 1)
            if peak:
                flops = model_config.flops_per_token(c.model, cfg.seq_len)
                result[f"{remat}_mfu"] = round(metrics.mfu(flops, tps, jax.device_count(), peak), 4)
    for remat in model_config.REMAT_NAMES[1:]:
        ratio = result[f"{remat}_temp_mib"] / max(result["none_temp_mib"], 1e-9)
        result[f"{remat}_temp_ratio"] = round(ratio, 4)
    result["full_time_ratio"] = round(result["full_step_s"] / result["none_step_s"], 3)
    return result


def _time(compiled, state, opt_state, tokens, repeats: int) -> float:
    jax.block_until_ready(compiled(state, opt_state, tokens))           # warm-up (donation: none)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(compiled(state, opt_state, tokens))
        times.append(time.perf_counter() - start)
    return statistics.median(times)
