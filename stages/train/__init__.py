"""The training stage: a Llama-style decoder trained with JAX/Flax NNX on the shard stage's tokens.

    make pipeline                                          (gin/tiny.gin: a tiny model, minutes on CPU)
    make pipeline OVERRIDES='train.OptimizerConfig.learning_rate=1e-3'   (reruns train and evaluate)
    make pipeline GIN=gin/600b.gin                         (the flagship; gin/twins/600b.gin on a CPU)
    make pipeline GIN=gin/mixtures/prose_code.gin          (a mixture of sources: train.Mixture, mixture.py)

Writes into `out_dir`: `checkpoint/` (the final Orbax checkpoint: params, optimizer state, step),
`metrics.jsonl`, `tensorboard/`, `summary.json`; the cache adds `config.gin`. Periodic checkpoints
go to `work_dir`, the scratch directory the cache hands every stage and keeps across failed attempts of
a key, so a preempted run resumes from its last save with exactly the batches an uninterrupted run would
have seen.

Modules, one job each: `model.py` (the decoder), `attention.py` (the only place kernels are chosen),
`sharding.py` (mesh and logical axes), `optimizer.py`, `loss.py` (chunked cross entropy),
`data.py` (memory-mapped shards; the batch is a pure function of the step), `window_order.py` (the
stateless permutation of a source's windows each epoch), `mixture.py` (weights by tokens over sources,
phases, the repetition limit), `checkpoint.py` (Orbax), `trained.py` (the final
checkpoint's model, rebuilt for scoring), `metrics.py` (jsonl, TensorBoard, MFU), `loop.py` (the training
loop), `step.py` (the train step and the loss, pure functions the loop jits), `worker.py` (one process;
launchers in `stages/train/launch.py`), `stop.py` (the stop signal and its exit code), `tracking.py` (W&B,
optional; pipeline/tracked.py adds the DAG to a run afterwards) and `wandb_files.py` (W&B's run files, read
back when a run resumes). `planning/` answers "will it fit and how long" from the config alone (`make plan`,
and the refusal of a config that cannot fit before anything compiles).
`Config` and `LaunchConfig` are defined in `stage_config.py` (so no module of the stage imports this
package) and re-exported here with CONFIGURABLES, VERSION, run, plan, check and summary.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping
from fractions import Fraction

from stages.io import storage
from stages.io.committed import by_source, stage_of
from stages.train import tracking
from stages.train.mesh import MeshConfig
from stages.train.mixture import Mixture, apportion
from stages.train.model_config import ModelConfig
from stages.train.optimizer_config import OptimizerConfig
from stages.train.planning import planner
from stages.train.planning.hardware import HardwareConfig, cpu_run_problem
from stages.train.stage_config import Config, LaunchConfig
from stages.train.tracking import Tracking

log = logging.getLogger(__name__)

CONFIGURABLES = (Config, ModelConfig, OptimizerConfig, MeshConfig, LaunchConfig, HardwareConfig, Mixture,
                 Tracking)
# 2: parameters and optimizer state are initialized by one jitted program directly in their shardings;
#    the weights differ from version 1's op-by-op initialization in the last bits.
# 3: YaRN's ramp ends at min(ceil(dim), head_dim - 1), as the paper's code and transformers do (it was clipped
#    at head_dim / 2 - 1, which changed the frequencies when the correction range reached past it).
# 4: a full capacity buffer drops its expert's lowest-scored assignments (within a choice), not the last
#    tokens of the device's batch.
# 5: each epoch reads a source's windows in a keyed Feistel order computed per position (window_order.py), not
#    a materialised rng.permutation(np.arange(M)): every epoch still holds each window once, in another order,
#    so the batches and the weights of every run change; and a mixture's metrics rows hold the rows and tokens
#    each source has given so far (mixture/<source>/rows, mixture/<source>/tokens).
VERSION = "5"


def resolve(config: Config, bound: frozenset[str]) -> Config:
    """`config` with the model config of `init_from`'s checkpoint, when it names one (init_from.py);
    `bound`: the "<Class>.<field>" names gin set, so a conflicting binding fails naming both values."""
    if not config.init_from:
        return config
    from stages.train import init_from

    fields = frozenset(name.removeprefix("ModelConfig.") for name in bound if name.startswith("ModelConfig."))
    return dataclasses.replace(config, model=init_from.resolve(config.model, fields, config.init_from))


def named_sources(config: Config) -> tuple[str, ...]:
    """The sources the mixture weighs (each gets its own download, clean and shard stages), or () for a
    one-source run."""
    return config.mixture.sources if config.mixture is not None else ()


def key_inputs(config: Config) -> dict | None:
    """What training starts from outside the cache: the init_from files it reads and their versions (from a
    listing: config.json, the index, the weight files it names, the tokenizer file), or None."""
    if not config.init_from:
        return None
    from stages.train import init_from

    return {"init_from": init_from.fingerprint(config.init_from)}


def run(config: Config, inputs: Mapping, out_dir: str, work_dir: str) -> None:
    from stages.train import launch, spec

    check_fits(config)
    if config.init_from:         # the weights must meet the tokenizer they were trained with
        from stages.train import init_from

        sp_model = storage.read_bytes(inputs["tokenizer"].file("tokenizer.model"))
        if problem := init_from.tokenizer_problem(sp_model, config.init_from):
            raise ValueError(f"train.Config.init_from: {problem}")
    spec_path = storage.join(work_dir, "spec.json")     # JSON, never code: every TPU host reads it (spec.py)
    shards = by_source(inputs, "shard")          # {"": shard} or, for a mixture, one per source
    if config.mixture is not None:
        check_mixture(config, shards)
    sources = shards if config.mixture is not None else {}
    first = next(iter(shards.values()))         # a mixture's sources share a tokenizer: its ids are any one's
    spec.write(spec.WorkerSpec(config, first, out_dir, work_dir, inputs.get("yardsticks"), sources=sources),
               spec_path)
    log.info("training %d steps with the %s launcher into %s", config.steps, config.launcher.kind, out_dir)
    launch.launch(config.launcher, spec_path)


def plan(config: Config, *, compile: bool | None = None) -> str:
    """The planner's report for `make plan`: memory per device, the verdict, the time (planning/planner.py).

    With `compile` (the default when train.HardwareConfig.topology names a TPU slice) the real train step
    is also compiled for that slice ahead of time (planning/aot.py) and XLA's per-device figure printed
    beside the estimate; that imports JAX and takes seconds to a minute.
    """
    p = planner.plan(config)
    if not (config.hardware.topology if compile is None else compile):
        return p.render()
    if p.problem:            # a batch that does not split over the mesh cannot even be traced
        return p.render(xla_note="this layout cannot run (the verdict says why)")
    # Planning needs no accelerator: keep JAX on the CPU (the topology is described, not used), which
    # also keeps libtpu from trying to start a TPU runtime here.
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    from stages.train.planning import aot

    compiled = []
    try:
        return p.render(xla=aot.compile_train_step(config, collectives=compiled), collectives=compiled)
    except aot.OutOfMemory as e:         # XLA's figure wins: the verdict says does NOT fit, quoting it
        return p.render(xla=e.figures, xla_note=e.said)
    except (RuntimeError, ValueError) as e:
        return p.render(xla_note=str(e))


def check(config: Config) -> str:
    """What stops `config` before anything runs, in one line, or "" (the command line asks before any stage
    starts, so a wrong mesh does not wait for the data half): a CPU run whose mesh or batch does not fit
    the devices its processes will have (`hardware.cpu_run_problem`), a config the planner says cannot fit
    its hardware (unless `train.HardwareConfig.allow_unfit`), a checkpoint (`init_from`) whose safetensors
    headers are damaged or do not hold the model its config.json describes (init_from.problem: headers
    only, never the weights), W&B tracking that cannot start (tracking.problem)."""
    if problem := cpu_run_problem(config, os.environ):
        return problem
    if problem := tracking.problem(config.tracking):    # W&B: its package, directory, API key and server
        return problem
    p = planner.plan(config)
    if not p.fits and not config.hardware.allow_unfit:
        verdict = p.render().splitlines()[-1].strip()
        return f"{verdict} (train.HardwareConfig.allow_unfit=True trains anyway; make plan shows the plan)"
    if config.init_from:
        from stages.train import init_from

        if problem := (init_from.problem(config.init_from, config.model)
                       or init_from.tokenizer_files_problem(config.init_from)):
            return f"train.Config.init_from={config.init_from!r}: {problem}"
    return ""


def check_upstream(config: Config, upstream: Mapping) -> str:
    """The pre-run check against the planned upstream configs (pipeline/checks.py: the stages it reads, and
    every node above them by node name), in one line, or "": a mixture that would repeat a source past
    train.Mixture.max_epochs even if every byte of its downloaded text became a token (`mixture_bound`),
    and a checkpoint (`init_from`) whose tokenizer has another number of pieces than the run's tokenizer
    will have (tokenizer.Config.vocab_size when it trains one, the pieces of its `pretrained` file
    otherwise): both found by `run` only after the data half otherwise."""
    if config.mixture is not None and (problem := mixture_bound(config, upstream)):
        return problem
    if not config.init_from:
        return ""
    from stages import tokenizer
    from stages.train import init_from

    tok = upstream["tokenizer"]
    try:
        if tok.pretrained:
            path = tokenizer.pretrained_file(tok.pretrained)
            pieces, where = init_from.sentencepiece_pieces(storage.read_bytes(path), path), path
        else:
            pieces, where = tok.vocab_size, "tokenizer.Config.vocab_size"
    except (OSError, ValueError):
        return ""          # an unreadable pretrained file is the tokenizer stage's own check to name
    if problem := init_from.vocab_problem(config.init_from, pieces, where):
        return f"train.Config.init_from={config.init_from!r}: {problem}"
    return ""


def check_inputs(config: Config, inputs: Mapping) -> str:
    """The pre-run check against what the cache holds (pipeline/checks.py), in one line, or "": a mixture that
    would read a source past train.Mixture.max_epochs, when every source's shard stage is committed (a
    weight change over cached data is refused before anything runs; otherwise `run` refuses it before
    compiling). `inputs`: {the name train reads it by: committed output or None}."""
    if config.mixture is None:
        return ""
    shards = by_source(inputs, "shard")
    if any(c is None for c in shards.values()):
        return ""
    return config.mixture.problem(steps=config.steps, global_batch=config.global_batch,
                                  windows=mixture_windows(config, shards))


# Characters a token, for `make plan`'s estimate of a source's tokens before a tokenizer exists (English
# text with an 8-50K BPE vocabulary is 3.5-4.5; code at a small vocabulary far less: 2.2 at vocab 800). The
# figures it gives are marked "estimate"; once the tokenizer is cached its measured figure replaces it.
CHARS_PER_TOKEN_GUESS = 4.0


def plan_inputs(config: Config, inputs: Mapping) -> str:
    """`make plan`'s mixture table: per phase and source the weight, the tokens asked for and the epochs they
    make of the source's training tokens: from its shard manifest once the shard stage is committed, else
    estimated ("~") from its clean stage's characters kept (`clean[<source>]` among `inputs`, which may hold
    every node upstream) over the characters a token the tokenizer measured on its sample of that source
    (`chars_per_token`), or, before the tokenizer exists, CHARS_PER_TOKEN_GUESS (marked "estimate")."""
    if config.mixture is None:
        return ""
    shards = by_source(inputs, "shard")
    windows = mixture_windows(config, {s: c for s, c in shards.items() if c is not None})
    measured = chars_per_token(inputs)
    guessed = {s: w for s, w in estimated_windows(config, inputs, measured).items() if s not in windows}
    mix, tokens_per_row = config.mixture, config.seq_len
    rows = [("phase", "steps", "source", "weight", "tokens asked", "tokens held", "epochs")]
    for p, (start, end, asked) in enumerate(mix.phase_rows(config.steps, config.global_batch)):
        for source, n in asked.items():
            held, mark = windows.get(source) or guessed.get(source), "~" if source in guessed else ""
            assumed = " estimate" if source in guessed and source not in measured else ""
            rows.append((str(p), f"{start}-{end}", source, f"{float(mix.fractions(p)[source]):.3f}",
                         f"{n * tokens_per_row:,}",
                         f"{mark}{held * tokens_per_row:,}{assumed}" if held else "not cleaned yet",
                         f"{mark}{n / held:.2f}" if held else "-"))
    total = mix.epochs(config.steps, config.global_batch, windows) if len(windows) == len(shards) else {}
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["mixture (train.Mixture, by tokens; epochs = passes over a source's training tokens):"]
    lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    if total:
        lines.append("  whole run: " + ", ".join(f"{s} {e:.2f} epochs" for s, e in total.items()) +
                     f" (limit {mix.max_epochs:g})")
    if guessed:
        lines.append("  ~: estimated from the source's clean stage before its shards exist (characters kept "
                     "/ characters a token, the validation split not taken off); the limit is checked on the "
                     "shards' real counts")
    if by_tokenizer := sorted(s for s in guessed if s in measured):
        lines.append("     characters a token as the tokenizer measured them on its sample: " +
                     ", ".join(f"{s} {measured[s]:.2f}" for s in by_tokenizer))
    if assumed := sorted(s for s in guessed if s not in measured):
        lines.append(f"  estimate: no tokenizer yet, so {CHARS_PER_TOKEN_GUESS:g} characters a token are "
                     f"assumed for {', '.join(assumed)} (code at a small vocabulary has about half that); "
                     "the tokenizer's own figure replaces the guess once it is built")
    if problem := check_inputs(config, inputs):
        lines.append(f"  REFUSED: {problem}")
    return "\n".join(lines)


def chars_per_token(inputs: Mapping) -> dict[str, float]:
    """{source: characters a token} as the committed tokenizer among `inputs` measured them on its sample of
    each source (stats.json `sources[<source>].chars_per_token`; a one-source tokenizer's under ""), or {}
    when the tokenizer is not built yet."""
    tokenizer = inputs.get("tokenizer")
    if tokenizer is None:
        return {}
    stats = storage.read_json(tokenizer.file("stats.json"))
    found = {source: s.get("chars_per_token") for source, s in stats.get("sources", {}).items()}
    found.setdefault("", stats.get("chars_per_token"))
    return {source: figure for source, figure in found.items() if figure}


def estimated_windows(config: Config, inputs: Mapping, measured: Mapping[str, float] | None = None
                      ) -> dict[str, int]:
    """Each source's training windows as `make plan` estimates them before its shards exist: its clean
    stage's characters kept / characters a token (`measured`: {source: the tokenizer's figure}, by default
    `chars_per_token(inputs)`; CHARS_PER_TOKEN_GUESS for a source without one) / seq_len (the validation
    split not taken off)."""
    measured = chars_per_token(inputs) if measured is None else measured
    cleans = by_source(inputs, "clean") if any(stage_of(n) == "clean" for n in inputs) else {}
    kept = {source: storage.read_json(clean.file("stats.json"))["chars_kept"]
            for source, clean in cleans.items() if clean is not None}
    return {source: int(chars / measured.get(source, CHARS_PER_TOKEN_GUESS) / config.seq_len)
            for source, chars in kept.items()}


def mixture_bound(config: Config, upstream: Mapping) -> str:
    """Why the mixture must repeat a source past train.Mixture.max_epochs whatever its data turn out to hold,
    in one line, or "": each source's tokens are at most its download source's `text_bound()` (bytes of text
    plus one dummy prefix, bos and eos per document, from a listing: a token is a piece of at least one
    character or a fallback byte), before cleaning drops any, so fewer windows than that bound gives are
    certain. A source without a bound (compressed files, the hub) is not judged. `upstream`: node -> config,
    as pipeline/checks.py gives it (`download[web]`). Clean's NFC can lengthen a few rare characters
    (composition exclusions); the bound takes the text as downloaded."""
    bounds, windows = {}, {}
    for source in config.mixture.sources:
        download = upstream.get(f"download[{source}]")
        bound = getattr(getattr(download, "source", None), "text_bound", lambda: None)()
        if bound is not None:
            bounds[source] = bound
        windows[source] = bound // config.seq_len if bound is not None else 2 ** 62
    asked = config.mixture.rows_before(config.steps, config.global_batch)
    for source, epochs in config.mixture.epochs(config.steps, config.global_batch, windows).items():
        if source in bounds and epochs > config.mixture.max_epochs:
            return (f"train.Mixture: source {source!r} would be read at least {epochs:.3g} times, past "
                    f"max_epochs={config.mixture.max_epochs:g}: the run asks {asked[source]:,} rows of "
                    f"{config.seq_len} tokens of it, and its download holds at most {bounds[source]:,} "
                    f"tokens (every byte of its text a token, before cleaning drops any); lower its weight, "
                    "raise train.Mixture.max_epochs, or give that source more data")
    return ""


def check_mixture(config: Config, shards: Mapping) -> None:
    """Refuses, before anything compiles, a mixture that would read a source past train.Mixture.max_epochs
    (counted from the shard manifests' token counts), in one line."""
    from stages.io.refusal import Refusal

    if problem := config.mixture.problem(steps=config.steps, global_batch=config.global_batch,
                                         windows=mixture_windows(config, shards)):
        raise Refusal(problem)


def mixture_windows(config: Config, shards: Mapping) -> dict[str, int]:
    """Each source's training windows of seq_len + 1 tokens (data.TokenStream's count), from its shard
    manifest."""
    out = {}
    for source, shard in shards.items():
        tokens = storage.read_json(shard.file("manifest.json"))["splits"]["train"]["tokens"]
        out[source] = max(0, (tokens - 1) // config.seq_len)
    return out


def one_phase(config: Config, weights: Mapping[str, float], windows: Mapping[str, int] | None = None
              ) -> tuple[dict[str, int], str]:
    """A mixture search's proxy (pipeline/mixsearch.py): `weights` ({source: a number >= 0}, normalized here)
    as whole rows of `config`'s batch, {source: rows a step} (the largest remainder, as a phase is split), and
    why `config` trained on one phase of those rows under its mixture's max_epochs cannot train, in one line,
    or "". `windows` ({source: training windows}, `mixture_windows`) checks the repetition limit too.

        rows, problem = train.one_phase(config, {"code": 0.3, "prose": 0.7}, windows)
    """
    exact = {name: Fraction(w).limit_denominator(10**9) for name, w in weights.items()}
    total = sum(exact.values())
    rows = apportion({name: w / total for name, w in exact.items()}, config.global_batch)
    max_epochs = config.mixture.max_epochs if config.mixture is not None else Mixture.max_epochs
    mixture = Mixture(phases=((0, rows),), max_epochs=max_epochs)
    return rows, mixture.problem(steps=config.steps, global_batch=config.global_batch, windows=windows)


def check_fits(config: Config) -> None:
    """Refuses, before anything compiles, a config the planner says cannot fit its hardware."""
    p = planner.plan(config)
    if not p.fits and not config.hardware.allow_unfit:
        raise ValueError(f"{p.render()}\nRefusing to train a config that does not fit; set "
                         "train.HardwareConfig.allow_unfit=True to try anyway.")


def summary(out) -> str:
    """One line for the run summary, from a committed training run (a `stages.io.committed.Committed`)."""
    s = storage.read_json(out.file("summary.json"))
    return (f"{s['params']:,} params, {s['steps']} steps, final loss {s['final_loss']:.3f}, "
            f"eval loss {s.get('eval_loss', float('nan')):.3f}, {s['tokens_per_s']:,.0f} tokens/s")
