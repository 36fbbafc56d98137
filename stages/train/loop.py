"""The training loop, in named steps around a jitted pure `train_step` (step.py).

    from stages.train import loop
    loop.train(config, shard_committed, out_dir, work_dir)     # what worker.main calls

    train      set_up -> resume -> (one_interval, checkpoint_or_stop) until the last step -> finish
    set_up     the mesh, the data, the model and optimizer on the mesh, the jitted steps
    resume     the newest periodic checkpoint of this key, if an earlier attempt left one
    one_interval   the steps up to the next logging step: one device sync, one metrics row
    checkpoint_or_stop   the periodic checkpoint, or a checkpoint and `TrainingStopped` on a stop request
    finish     the final checkpoint and summary.json into the committed attempt

    init_program, jit_steps, step_options   the programs set_up builds: every parameter created in its
               sharding, and step.py's functions jitted with the config's numbers and the shardings
               (aot.py compiles them ahead of time for a TPU slice)

State is (params, opt_state, step). The batch at step s is `data.batch(s)`, a pure function of s
and the seed, so resuming from a checkpoint at step s replays exactly the batches an
uninterrupted run would see (bitwise on CPU). A stop request (SIGTERM, Ctrl-C, or `stop_after` in
tests; `stop.py`) saves a checkpoint and raises `TrainingStopped`; rerunning the stage resumes from it.
In a multi-process run the processes agree on the step to stop after (`agreed_stop.py`), so a signal
that reaches one host only, or the hosts at different moments, still gives one complete checkpoint.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np
import optax
from flax import nnx

from stages.io import storage
from stages.train import checkpoint, data, metrics, model, optimizer, scoring, sharding, tracking
from stages.train.agreed_stop import AgreedStop
from stages.train.model_config import flops_per_token, param_counts
from stages.train.step import eval_step, train_step
from stages.train.stop import STOPPED_EXIT_CODE, TrainingStopped, stop_requests
from stages.yardsticks import score, tokenized

log = logging.getLogger(__name__)
HISTORY = "metrics.jsonl"      # in work_dir: the metrics rows up to the newest checkpoint, for a resume
# Steps the host dispatches before waiting for the device: one running and one queued keeps the device
# busy, and a stop request (SIGTERM, Ctrl-C) is seen within about one step whatever log_every and
# checkpoint_every are (JAX dispatch is asynchronous: unbounded, the host would queue a whole logging
# interval and notice the request only once the device had run all of it).
MAX_IN_FLIGHT = 2


def train(cfg, shard, out_dir: str, work_dir: str, *, yardsticks=None, sources=None, process_index: int = 0,
          process_count: int = 1) -> dict:
    """Trains `cfg` (a `stages.train.Config`) on a committed shard stage; returns the summary. With a
    committed yardsticks stage, every evaluation step also scores its in-loop subset (`in_loop_scores`).
    With `sources` ({source: committed shard stage}) it trains on cfg.mixture of them (data.MixedTokenData).

    Periodic checkpoints go to `work_dir`, the final one, the metrics and summary.json to `out_dir`.
    Raises `TrainingStopped` after saving when asked to stop before the last step.
    """
    manifest = storage.read_json(shard.file("manifest.json"))
    with contextlib.ExitStack() as stack:
        # From here SIGTERM (preemption) and Ctrl-C ask for a stop: a checkpoint after the current step.
        request = stack.enter_context(stop_requests())
        # Metrics are written locally and copied up at the end when out_dir is remote.
        local_out = out_dir if storage.is_local(out_dir) else stack.enter_context(
            tempfile.TemporaryDirectory(prefix="refinery-train-"))
        if sources:       # {source: local files}: a stream of its own per source
            manifest = same_tokens(sources)
            train_files = {s: stack.enter_context(storage.local_files(c.paths("train-*.bin")))
                           for s, c in sources.items()}
            val_files = {s: stack.enter_context(storage.local_files(c.paths("val-*.bin")))
                         for s, c in sources.items()}
        else:
            train_files = stack.enter_context(storage.local_files(shard.paths("train-*.bin")))
            val_files = stack.enter_context(storage.local_files(shard.paths("val-*.bin")))
        run, params, opt_state = set_up(cfg, manifest, train_files, val_files, process_index, process_count,
                                        tokenized.load(yardsticks, in_loop=True) if yardsticks else None)
        stack.enter_context(jax.set_mesh(run.mesh))       # every step is traced under the mesh
        stop = AgreedStop(request, run.mesh, process_count)   # all processes stop after the same step
        ckpt = checkpoint.Checkpointer(storage.join(work_dir, "checkpoints"), keep=cfg.keep_checkpoints,
                                       every=cfg.checkpoint_every)
        writer = tracked = None
        try:
            params, opt_state, start = resume(run, ckpt, params, opt_state)
            if process_index == 0:        # W&B (tracking.py): None unless train.Tracking asks
                tracked = tracking.Run.start(cfg.tracking, work_dir, key=key_of(work_dir),
                                             config=tracked_config(cfg), resuming=start > 0)
            # The rows logged before the checkpoint this run resumed from, so metrics.jsonl (and the
            # report's curves) run from step 1 across any number of stops and resumes.
            history_path = storage.join(work_dir, HISTORY)
            writer = metrics.MetricsWriter(local_out, total_steps=cfg.steps, enabled=process_index == 0,
                                           history=metrics.read_history(history_path, upto=start)
                                           if process_index == 0 and start else ())
            if tracked is not None:       # the rows a hard kill kept from W&B's files (tracking.py)
                tracked.resend(writer.rows)

            def saved(step: int) -> None:      # with each checkpoint, the rows up to its step
                if process_index == 0:
                    storage.write_text(history_path, writer.jsonl(upto=step))

            # Resumed at the last step (killed after its final checkpoint, before the commit), no interval
            # runs: the summary's numbers come from the rows logged before.
            last = writer.rows[-1] if writer.rows else {}
            throughput = next((r for r in reversed(writer.rows) if "tokens_per_s" in r), {})
            for begin, end in intervals(start, cfg.steps, cfg.log_every, cfg.eval_every):
                params, opt_state, last = one_interval(run, params, opt_state, begin, end, ckpt, stop,
                                                       first=begin == start, on_saved=saved)
                writer.write(last)
                if tracked is not None:
                    tracked.log(last)
                if "tokens_per_s" in last:
                    throughput = last
                # After the interval's losses were checked: a non-finite loss never reaches a checkpoint.
                checkpoint_or_stop(run, ckpt, stop, params, opt_state, end - 1, on_saved=saved)
            if tracked is not None:        # its state into the output, which the pipeline reads
                tracked.close(local_out)
                tracked = None
        except BaseException as e:
            if tracked is not None:        # stopped or failed: the W&B run ends unfinished; a resume goes on
                close_unfinished(tracked, STOPPED_EXIT_CODE if isinstance(e, TrainingStopped) else 1)
            raise
        finally:
            if writer is not None:
                writer.close()
            ckpt.close()
        return finish(run, params, opt_state, out_dir, local_out, last, throughput, process_index)


def close_unfinished(tracked, exit_code: int) -> None:
    """Ends the W&B run of a training that stopped or failed with `exit_code`; a tracker that fails here is a
    warning, so the stop (or the failure) is what the launcher sees, not W&B's error."""
    try:
        tracked.close(exit_code=exit_code)
    except Exception as e:  # noqa: BLE001 - the training's own outcome must not be masked by the tracker's
        log.warning("could not finish the W&B run (exit code %d): %s: %s", exit_code, type(e).__name__, e)


def key_of(work_dir: str) -> str:
    """The training key, from its work directory: the cache lays a stage out as <stage>/<key>/work."""
    return work_dir.rstrip("/").split("/")[-2]


def tracked_config(cfg) -> dict:
    """What a W&B run shows as its config: the training config's fields the key covers (those marked
    `metadata={"key": False}`, how the run is launched, tracked and logged, left out)."""
    values = dataclasses.asdict(cfg)
    return {"train": {f.name: values[f.name] for f in dataclasses.fields(cfg) if f.metadata.get("key", True)}}


@dataclasses.dataclass(frozen=True)
class Run:
    """Everything `set_up` builds for one training run; the later steps read it, never change it."""

    cfg: Any                          # stages.train.Config
    model_config: Any                 # ModelConfig with the tokenizer's vocab size
    mesh: jax.sharding.Mesh
    batches: data.TokenData | data.MixedTokenData
    eval_data: list[np.ndarray]       # the held-out batches of every evaluation, (B_local, T + 1) each
    step_fn: Callable                 # (params, opt_state, batch) -> (params, opt_state, outputs)
    eval_fn: Callable                 # (params, batch) -> mean loss
    lr_at: Callable                   # step -> learning rate, for the logs
    flops_per_token: float
    peak: tuple[str, float | None]    # (device name, its published peak FLOP/s or None: no MFU)
    processes: int                    # training processes (hosts)
    yardsticks: Any = None            # tokenized.Yardsticks scored on evaluation steps, or None
    scorer: Any = None                # the scoring.Scorer they are scored with (its state set per use)


def set_up(cfg, manifest: dict, train_files: list[str], val_files: list[str], process_index: int,
           process_count: int, yardsticks=None) -> tuple[Run, nnx.State, Any]:
    """The run, and freshly initialized params and optimizer state placed on the mesh."""
    # The vocabulary is the tokenizer's, unless the weights come from a checkpoint (init_from), whose
    # embedding may be padded past it.
    mcfg = cfg.model if cfg.init_from else dataclasses.replace(cfg.model, vocab_size=manifest["vocab_size"])
    if cfg.init_from and manifest["vocab_size"] > mcfg.vocab_size:
        raise ValueError(f"the tokenizer has {manifest['vocab_size']:,} pieces, the model from "
                         f"train.Config.init_from={cfg.init_from!r} embeds {mcfg.vocab_size:,}")
    ocfg = cfg.optimizer_for_run()
    mesh = sharding.make_mesh(cfg.mesh)
    where = {"process_index": process_index, "process_count": process_count}
    if isinstance(train_files, dict):      # a mixture: one stream per source
        streams = {s: data.TokenStream(files, manifest) for s, files in train_files.items()}
        batches = data.MixedTokenData(streams, cfg.mixture, seq_len=cfg.seq_len,
                                      global_batch=cfg.global_batch, seed=cfg.seed, **where)
        # The in-loop held-out loss: each source's validation windows in turn (its training windows when it
        # has none), one batch of each, until eval_batches.
        held = [data.eval_batches(val_files[s] or train_files[s], manifest, seq_len=cfg.seq_len,
                                  batch_size=cfg.global_batch, **where) for s in sorted(train_files)]
        eval_data = [b for _, b in zip(range(cfg.eval_batches), _round_robin(held))]
    else:
        batches = data.TokenData(train_files, manifest, seq_len=cfg.seq_len, global_batch=cfg.global_batch,
                                 seed=cfg.seed, **where)
        held_out = data.eval_batches(val_files or train_files, manifest, seq_len=cfg.seq_len,
                                     batch_size=cfg.global_batch, **where)
        eval_data = [b for _, b in zip(range(cfg.eval_batches), held_out)]

    graphdef, tx, init = init_program(mcfg, ocfg, mesh)
    params, opt_state = init(cfg.seed)
    if cfg.init_from:             # the checkpoint's weights, in the same layout; fresh optimizer moments
        from stages.train import init_from

        params = init_from.load_params(cfg.init_from, mcfg, params)
        opt_state = jax.jit(tx.init, out_shardings=sharding.shardings_of(opt_state))(params)
    options = step_options(cfg, manifest["eos_id"])
    step_fn, eval_fn = jit_steps(graphdef, tx, options, sharding.shardings_of(params),
                                 sharding.shardings_of(opt_state), mesh)
    scorer = None
    if yardsticks and cfg.eval_every:
        # One fixed (global_batch, seq_len) shape, the training step's: one compile, no new memory peak.
        # Sharded as training is (rows over data x fsdp, params where they are), on every process. The model
        # as it trains: an MoE's capacity factor drops here (dropless over an expert axis would hold E x n x D
        # a device); the evaluate stage scores the dropless model, the export.
        scorer = scoring.Scorer(nnx.merge(graphdef, params), prefix_id=manifest["eos_id"],
                                rows=cfg.global_batch, length=cfg.seq_len, mesh=mesh)
    run = Run(cfg, mcfg, mesh, batches, eval_data, step_fn, eval_fn, optimizer.schedule(ocfg),
              flops_per_token(mcfg, cfg.seq_len), metrics.published_peak_flops(jax.devices()[0]),
              process_count, yardsticks if scorer else None, scorer)
    return run, params, opt_state


def init_program(mcfg, ocfg, mesh) -> tuple[nnx.GraphDef, optax.GradientTransformation, Callable]:
    """(graphdef, optimizer, init): `init(seed)` is one jitted program that creates every parameter and
    optimizer moment already split over the mesh, so no device ever holds more than its share, at any size.

    The model is first built abstractly (shapes only) and its parameters' shardings derived from their
    logical names. Call this outside `jax.set_mesh`: under a mesh context NNX would read the logical names
    as mesh axes.
    """
    def build(seed):      # the key nnx.Rngs(seed) makes, from a traced int32 seed inside the program
        return nnx.split(model.Transformer(mcfg, rngs=nnx.Rngs(jax.random.key(seed))), nnx.Param)

    graphdef, abstract = nnx.eval_shape(lambda: build(0))
    tx = optimizer.make_optimizer(ocfg, abstract)
    params_sh = sharding.param_shardings(abstract, mesh)
    opt_sh = sharding.opt_state_shardings(tx, abstract, params_sh, mesh)

    def init(seed):
        params = build(seed)[1]
        return params, tx.init(params)

    # The seed is an argument, not a constant of the program (the same bits as nnx.Rngs(seed)): every seed of
    # one model runs one executable, and XLA's compilation cache serves a sweep's next seed.
    return graphdef, tx, jax.jit(init, out_shardings=(params_sh, opt_sh))


def jit_steps(graphdef, tx, options: dict, params_sh, opt_sh, mesh) -> tuple[Callable, Callable]:
    """(train step, eval step), jitted with explicit shardings in and out: the state never leaves its
    layout, the batch is split over ("data", "fsdp"). Trace them under `jax.set_mesh(mesh)` (train() does)
    so the model's logical constraints on activations take effect."""
    batch_sh, replicated = sharding.batch_sharding(mesh), sharding.replicated(mesh)
    step_fn = jax.jit(functools.partial(train_step, graphdef, tx, **options, grad_shardings=params_sh),
                      donate_argnums=(0, 1),
                      in_shardings=(params_sh, opt_sh, batch_sh),
                      out_shardings=(params_sh, opt_sh, replicated))
    eval_fn = jax.jit(functools.partial(eval_step, graphdef, **loss_options(options)),
                      in_shardings=(params_sh, batch_sh), out_shardings=replicated)
    return step_fn, eval_fn


def step_options(cfg, eos_id: int) -> dict:
    """The numbers `train_step` takes from a `stages.train.Config` (bound with functools.partial)."""
    return {"eos_id": eos_id, "loss_chunk": cfg.loss_chunk, "z_loss": cfg.z_loss,
            "grad_accum_steps": cfg.optimizer.grad_accum_steps, "skip_nonfinite": cfg.nan_policy == "skip",
            "bias_rate": cfg.model.moe_bias_update_rate}


def loss_options(options: dict) -> dict:
    """The part of `step_options` that `forward_loss` takes."""
    return {k: options[k] for k in ("eos_id", "loss_chunk", "z_loss")}


def resume(run: Run, ckpt: checkpoint.Checkpointer, params, opt_state) -> tuple[Any, Any, int]:
    """(params, opt_state, first step): the newest checkpoint that restores, into the shardings of the
    fresh `params` and `opt_state`, or those themselves at step 0 when there is none. A checkpoint that
    fails to restore (damaged or half-written files) is deleted with a warning naming its step, and the
    one before it is tried."""
    abstract = _state(params, opt_state, 0, run.mesh)
    for step in sorted(ckpt.all_steps(), reverse=True):
        try:
            restored = ckpt.restore(step, abstract)
        except Exception as e:  # noqa: BLE001 - whatever Orbax or TensorStore raise on damaged files
            log.warning("checkpoint step %d in %s cannot be restored (%s: %s); deleting it and trying the "
                        "one before it", step, ckpt.directory, type(e).__name__, str(e).splitlines()[0][:300])
            ckpt.delete(step)
            continue
        log.info("resumed from step %d", int(restored["step"]))
        return restored["params"], restored["opt_state"], int(restored["step"])
    return params, opt_state, 0


def intervals(start: int, steps: int, every: int, eval_every: int = 0) -> Iterator[tuple[int, int]]:
    """The logging intervals [begin, end) from `start` to `steps`: a fresh run's first step alone (it is
    mostly compilation, so it is timed on its own and gives no rate), then up to each multiple of `every`,
    each multiple of `eval_every` (so evaluations happen where train.Config.eval_every says, whatever
    log_every is) and the last step: a metrics row is logged at the end of each. A resumed run keeps the
    same grid, so when it resumes from a logging step (checkpoint_every a multiple of log_every) its rows
    are the rows an uninterrupted run logs, number for number."""
    begin = start
    while begin < steps:
        ends = [steps, (begin // every + 1) * every]
        if eval_every:
            ends.append((begin // eval_every + 1) * eval_every)
        end = 1 if begin == 0 else min(ends)
        yield begin, end
        begin = end


def one_interval(run: Run, params, opt_state, begin: int, end: int, ckpt: checkpoint.Checkpointer,
                 stop: AgreedStop, *, first: bool,
                 on_saved: Callable[[int], None] = lambda step: None) -> tuple[Any, Any, dict]:
    """Steps [begin, end), and the checkpoints (or stop) after each but the last, then one device sync
    for the whole interval: every step's loss is checked, the numbers averaged into one metrics row (and
    the held-out loss added on evaluation steps). `first`: the run's first interval, timed but not a
    rate. The host stays MAX_IN_FLIGHT steps ahead of the device at most. Raises `TrainingStopped` after
    saving when a stop was requested."""
    cfg = run.cfg
    started = time.perf_counter()
    pending = []                                          # (step, device outputs), fetched together
    for step in range(begin, end):
        batch = sharding.global_batch(run.batches.batch(step), run.mesh)
        params, opt_state, out = run.step_fn(params, opt_state, batch)
        stop.cast(step)                                   # multi-process: this step's stop vote
        pending.append((step, out))
        if len(pending) >= MAX_IN_FLIGHT:
            wait_for(*pending[-MAX_IN_FLIGHT])
        if step + 1 < end:               # the interval's last step is the caller's, after the checks below
            checkpoint_or_stop(run, ckpt, stop, params, opt_state, step, on_saved=on_saved)

    fetched = [(s, jax.device_get(o)) for s, o in pending]
    for s, o in fetched:
        if not metrics.check_finite(s, float(o["loss"]), cfg.nan_policy):
            log.warning("step %d: non-finite loss %s, update skipped", s, o["loss"])
    dt = (time.perf_counter() - started) / (end - begin)
    tps = cfg.global_batch * cfg.seq_len / dt
    o = fetched[-1][1]
    row = {"step": end, "loss": float(np.mean([f[1]["loss"] for f in fetched])),
           "accuracy": float(np.mean([f[1]["accuracy"] for f in fetched])),
           "learning_rate": float(run.lr_at(end - 1)), "grad_norm": float(o["grad_norm"]),
           "param_norm": float(o["param_norm"])}
    if "moe/load" in o:
        row |= moe_row([f[1] for f in fetched])
    if cfg.mixture is not None:
        row |= mixture_row(cfg, end)
    if first:
        row["compile_and_first_step_s"] = dt              # mostly compilation: not a rate
    else:
        row |= {"tokens_per_s": tps, "step_time_s": dt}
        if run.peak[1] is not None:                    # a CPU has no published peak: no MFU (metrics.py)
            row["mfu"] = metrics.mfu(run.flops_per_token, tps, jax.device_count(), run.peak[1])
    if cfg.eval_every and (end % cfg.eval_every == 0 or end == cfg.steps):
        row["eval_loss"] = evaluate(run.eval_fn, params, run.eval_data, run.mesh)
        row |= in_loop_scores(run, params)
    return params, opt_state, row


def mixture_row(cfg, step: int) -> dict[str, int]:
    """A metrics row's mixture entries at `step`: the rows and tokens each source has given the batches of
    steps 0 .. step - 1, cumulative (`mixture/<source>/rows`, `mixture/<source>/tokens`, seq_len a row): the
    sampler's own counts (`Mixture.rows_before`, a pure function of the step, so a resumed run logs the
    numbers an uninterrupted one does)."""
    rows = cfg.mixture.rows_before(step, cfg.global_batch)
    return {f"mixture/{s}/{what}": n * scale for s, n in rows.items()
            for what, scale in (("rows", 1), ("tokens", cfg.seq_len))}


def moe_row(outputs: list[dict]) -> dict:
    """A metrics row's MoE entries from an interval's step outputs: the balancing losses and the dropped
    share (means), moe/dropped_worst_sequence (the most any one sequence of any MoE layer lost in the
    interval), moe/max_load (the most loaded expert's share x E, averaged over the MoE layers: 1.0 is
    perfect balance, E all tokens to one expert) and moe/load (each expert's share, averaged over the
    layers: a list of E numbers)."""
    load = np.mean([o["moe/load"] for o in outputs], axis=0)                 # (L_moe, E)
    row = {k: float(np.mean([o[k] for o in outputs]))
           for k in ("moe/aux_loss", "moe/router_z_loss", "moe/dropped")}
    row["moe/dropped_worst_sequence"] = float(max(o["moe/dropped_worst_sequence"] for o in outputs))
    return row | {"moe/max_load": float(load.max(-1).mean() * load.shape[-1]),
                  "moe/load": [round(float(v), 6) for v in load.mean(0)]}


def in_loop_scores(run: Run, params) -> dict[str, float]:
    """The yardsticks' in-loop subset under `params` (OLMo's in-loop evaluation): reference bits per byte
    and task accuracies, as metrics-row entries `yardstick/...` (`score.in_loop_row`); {} without any."""
    if run.scorer is None:
        return {}
    run.scorer.state = params        # the training state: the same tree the scorer was built from
    return score.in_loop_row(score.score(run.scorer, run.yardsticks))


def wait_for(step: int, outputs: dict) -> None:
    """Blocks until the device has finished `step` (whose `outputs` are still on the device)."""
    jax.block_until_ready(outputs["loss"])


def checkpoint_or_stop(run: Run, ckpt: checkpoint.Checkpointer, stop: AgreedStop, params, opt_state,
                       step: int, *, on_saved: Callable[[int], None] = lambda step: None) -> None:
    """After `step`: the periodic checkpoint, or, when a stop was requested, a checkpoint now and
    `TrainingStopped`. A stop request at the last step just finishes: the final checkpoint follows anyway.
    `on_saved(step)` runs after each checkpoint is saved."""
    cfg, done = run.cfg, step + 1
    asked = stop.asked(step)           # every process gets the same answer (agreed_stop.py)
    stopping = done < cfg.steps and (asked or 0 < cfg.stop_after <= done)
    if (stopping or done % cfg.checkpoint_every == 0) and ckpt.save(
            done, _state(params, opt_state, done, run.mesh), force=stopping):
        on_saved(done)
    if stopping:
        ckpt.wait()
        reason = stop.reason if asked else f"stop_after={cfg.stop_after}"
        raise TrainingStopped(f"stopped at step {done} ({reason}); the checkpoint is saved: "
                              "rerun the stage to resume from it")


def finish(run: Run, params, opt_state, out_dir: str, local_out: str, last: dict, throughput: dict,
           process_index: int) -> dict:
    """Saves the final checkpoint into `out_dir` and, on the first process, summary.json (copying the
    locally written metrics up when `out_dir` is remote). Returns the summary."""
    cfg = run.cfg
    final = checkpoint.Checkpointer(storage.join(out_dir, "checkpoint"), keep=1, every=1, async_save=False)
    final.save(cfg.steps, _state(params, opt_state, cfg.steps, run.mesh), force=True)
    final.close()
    summary = {"params": sum(param_counts(run.model_config).values()), "steps": cfg.steps,
               "final_loss": last.get("loss"), "eval_loss": last.get("eval_loss", float("nan")),
               "tokens_per_s": throughput.get("tokens_per_s"), "mfu": throughput.get("mfu"),
               "device": run.peak[0], "devices": jax.device_count(), "processes": run.processes,
               "model": dataclasses.asdict(run.model_config), "seq_len": cfg.seq_len,
               "global_batch": cfg.global_batch}
    if cfg.mixture is not None:      # what the sampler gave each source over the run: rows, tokens, epochs
        rows = cfg.mixture.rows_before(cfg.steps, cfg.global_batch)
        summary["mixture"] = {s: {"rows": rows[s], "tokens": rows[s] * cfg.seq_len,
                                  "share": rows[s] / (cfg.steps * cfg.global_batch),
                                  "epochs": rows[s] / run.batches.num_windows[s]} for s in rows}
        log.info("mixture: %s", ", ".join(f"{s} {m['tokens']:,} tokens ({m['share']:.1%}, {m['epochs']:.2f} "
                                          "epochs)" for s, m in summary["mixture"].items()))
    if process_index == 0:
        _publish(local_out, out_dir, summary)
    return summary


def same_tokens(sources) -> dict:
    """The shard manifest the sources share (one tokenizer made them all), or ValueError naming the two that
    differ in vocabulary, dtype or special ids."""
    manifests = {s: storage.read_json(c.file("manifest.json")) for s, c in sources.items()}
    first, manifest = next(iter(manifests.items()))
    for s, m in manifests.items():
        for field in ("vocab_size", "dtype", "eos_id", "bos_id", "add_bos"):
            if m.get(field) != manifest.get(field):
                raise ValueError(f"the shards of sources {first!r} and {s!r} differ in {field} "
                                 f"({manifest.get(field)!r} vs {m.get(field)!r}): a mixture needs one "
                                 "tokenizer")
    return manifest


def _round_robin(iterators):
    """One item of each iterator in turn, skipping those that ran out."""
    live = list(iterators)
    while live:
        for it in list(live):
            try:
                yield next(it)
            except StopIteration:
                live.remove(it)


def evaluate(eval_fn, params, batches, mesh) -> float:
    losses = [float(eval_fn(params, sharding.global_batch(b, mesh))) for b in batches]
    return float(np.mean(losses)) if losses else float("nan")


def _state(params, opt_state, step: int, mesh) -> dict:
    """What a checkpoint holds. The step is a scalar replicated over the mesh: a global array, which Orbax
    can save from many hosts (a host-local scalar it refuses in a multi-process job)."""
    return {"params": params, "opt_state": opt_state,
            "step": jax.device_put(np.int32(step), sharding.replicated(mesh))}


def _publish(local_out: str, out_dir: str, summary: dict) -> None:
    """summary.json next to the metrics; when out_dir is remote, copy the local files up."""
    with open(os.path.join(local_out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2, sort_keys=True, default=str)
    if local_out == out_dir:
        return
    for root, _, files in os.walk(local_out):
        for name in files:
            rel = os.path.relpath(os.path.join(root, name), local_out)
            storage.upload(os.path.join(root, name), storage.join(out_dir, *rel.split(os.sep)))
