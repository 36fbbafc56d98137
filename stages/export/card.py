"""The exported model's card (README.md): what made the model and how it scored, from the run's own outputs.

    card.model_card("refinery-3f2a", inputs, model_config, ("</s>", 2))   # markdown

It records the cache key of every stage the model was made from (the export's inputs, and every stage
before them, found by following the manifests' upstream keys: each source's download, score and clean, the
reference model's run; `stage_keys`), each stage's one-line figures (the data recipe's: documents kept and
dropped by reason, tokens; the tokenizer's bytes per token; training's loss; the evaluation's yardsticks with
their intervals), what a context must start with and how lm-eval reproduces the scores, and the gin config
the keys cover, so the run can be reproduced from the card alone. The card is a function of the export's
key: nothing that depends on the machine or the run's timing (tokens/s, wall time, a local path), so two
exports of one key are the same bytes and an uploaded model carries no machine path (the upstream keys a
manifest names are part of its own key; only a commit removed from the cache before the export ran leaves
out what it read).
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Mapping

from stages.io import committed, storage
from stages.io.committed import REFERENCE, Committed, node_name, source_of, stage_of

log = logging.getLogger(__name__)
Node = tuple[str, str]              # (stage, key): one commit, whatever name a reader reads it by


def _heads(mcfg) -> str:
    if mcfg.attention_kind == "mla":
        rank = mcfg.q_lora_rank or "full"
        return (f"{mcfg.n_heads} heads of multi-head latent attention (query rank {rank}, "
                f"key-value rank {mcfg.kv_lora_rank}, head dims {mcfg.qk_nope_head_dim} + "
                f"{mcfg.qk_rope_head_dim} rope, values {mcfg.v_head_dim})")
    return f"{mcfg.n_heads} heads / {mcfg.n_kv_heads} kv heads"


def model_card(name: str, inputs: Mapping, mcfg, start: tuple[str, int] | None = None) -> str:
    """The card's markdown. start: (piece, id) of the token every context starts with (the export's
    bos_token); None when no tokenizer was exported."""
    from stages.train import hf

    keys, arch = stage_keys(inputs), hf.architecture(mcfg)
    evaluation = inputs.get("evaluate")
    scores = (storage.read_json(evaluation.file("eval.json"))
              if evaluation is not None and "eval.json" in evaluation.files else None)
    kind = hf.MODEL_TYPES[arch]
    experts = (f"; {mcfg.n_experts} routed experts, top-{mcfg.n_experts_per_token}"
               + (f", {mcfg.n_shared_experts} shared" if mcfg.n_shared_experts else "")
               + (f", {mcfg.n_dense_layers} dense layers first" if mcfg.n_dense_layers else "")
               if mcfg.n_experts else "")
    lines = ["---", "library_name: transformers", "pipeline_tag: text-generation",
             f"tags: [refinery, {kind}]", "---", "", f"# {name}", "",
             f"A decoder in transformers' {arch} architecture ({_params(mcfg)} parameters: "
             f"{mcfg.n_layers} layers, d_model {mcfg.d_model}, {_heads(mcfg)}{experts}, "
             f"vocabulary {mcfg.vocab_size:,}, context {mcfg.max_seq_len:,}) trained from "
             "raw text by Refinery's cached pipeline. Load it with transformers:", "", "```python",
             "from transformers import AutoModelForCausalLM, AutoTokenizer",
             'model = AutoModelForCausalLM.from_pretrained("<this directory or hub id>")',
             'tokenizer = AutoTokenizer.from_pretrained("<this directory or hub id>")', "```", "",
             *[line for note in hf.notes(mcfg) for line in (note, "")],
             *(_context_start(*start, _max_length(scores)) if start else []),
             "## The run", "", "| stage | cache key | figures |", "|---|---|---|"]
    for stage, key in keys.items():
        lines.append(f"| {stage} | `{key}` | {_summary(stage, inputs.get(stage))} |")
    lines += ["", "Every figure above is read from that stage's committed output; the keys identify the "
              "outputs (`<cache_root>/<stage>/<key>/`)."]
    if scores is not None:
        lines += ["", "## Evaluation", "", *_evaluation(scores)]
    gin = _config_gin(inputs)
    if gin:
        lines += ["", "## Configuration", "", "The gin bindings the cache keys cover:", "", "```",
                  gin.strip(), "```"]
    return "\n".join(lines) + "\n"


def stage_keys(inputs: Mapping[str, Committed]) -> dict[str, str]:
    """name -> cache key of every stage the model was made from, each once, each after the stages it read: the
    export's inputs, by the names it reads them by, and every stage they read, directly or not, found by
    following the manifests' upstream keys (`committed.manifest_of`, from the cache the inputs were committed
    to: one no longer there is still listed, by the key its reader's manifest names, but not what it read).

    A stage is named as the run's plan names its node: by the name it is read by, with its reader's source
    (clean[code] reads `score`: score[code]); read under the names of several sources, by its stage alone
    (the one classifier every source's score reads); a stage the export reads itself, met again under another
    key, is the reference model's run's (perplexity's `train`: train[reference]), and so is what it read. In
    a mixture of one source nothing tells a stage the source shares from its own: it gets the source's name.
    """
    anchor = next(iter(inputs.values()), None)
    names: dict[Node, str] = {}
    manifests: dict[Node, Mapping] = {}
    for name, c in inputs.items():
        names.setdefault((stage_of(name), c.key), name)
        manifests.setdefault((stage_of(name), c.key), c.manifest)
    reads: dict[Node, list[Node]] = {}                      # what each commit read
    readers: dict[Node, list[tuple[Node, str]]] = {}        # who read each, and by which name
    todo = list(names)
    while todo:
        node = todo.pop()
        if node not in manifests:
            manifests[node] = committed.manifest_of(anchor, *node) or {}
        reads[node] = []
        for read_as, key in _upstream(manifests[node]).items():
            child = (stage_of(read_as), key)
            reads[node].append(child)
            readers.setdefault(child, []).append((node, read_as))
            if child not in reads and child not in todo:
                todo.append(child)

    order: list[Node] = []          # each after the stages it read

    def visit(node: Node) -> None:
        if node not in order:
            for child in sorted(set(reads[node])):
                visit(child)
            order.append(node)

    for node in list(names):
        visit(node)
    exported = {stage_of(name) for name in inputs}
    for node in reversed(order):    # each after every stage that read it: its readers are named
        if node in names:
            continue
        stage, key = node
        proposed = set()
        for reader, read_as in readers[node]:
            if source_of(read_as):              # read by its source's name: the tokenizer reads clean[code]
                proposed.add(read_as)
            elif stage in exported:             # one of the stages the export reads, with another key
                proposed.add(node_name(stage, REFERENCE))
            else:
                proposed.add(node_name(stage, source_of(names[reader])))
        name = proposed.pop() if len(proposed) == 1 else stage
        # Two commits of one stage under one name: no run of today's DAG has them; the key tells them apart.
        names[node] = name if name not in names.values() else f"{name} ({key[:12]})"
    return {names[node]: node[1] for node in order}


def _upstream(manifest: Mapping) -> dict[str, str]:
    """A manifest's upstream {name it was read by: key}, {} when it has none (a test's hand-made output)."""
    found = manifest.get("upstream")
    if not isinstance(found, Mapping):
        return {}
    return {name: key for name, key in found.items() if isinstance(name, str) and isinstance(key, str)}


def _max_length(scores: dict | None) -> int | None:
    """lm-eval's max_length the evaluation cut task requests by (eval.json's scoring), None if unknown."""
    return (scores or {}).get("scoring", {}).get("max_length")


def _context_start(piece: str, token_id: int, max_length: int | None = None) -> list[str]:
    cut = (f",max_length={max_length}` for multiple-choice and other loglikelihood tasks (Refinery's "
           f"evaluation cut each request as lm-eval does with that max_length: its last {max_length} + 1 "
           "tokens of context + answer; without it lm-eval takes this model's context length and refuses "
           "any answer longer than that)" if max_length else
           "` for multiple-choice and other loglikelihood tasks")
    return ["## What a context starts with", "",
            f"In training every document followed `{piece}` (id {token_id}), so the model predicts a text's "
            f"first token after it: a context must start with `{piece}`. The tokenizer's `bos_token` is "
            f"`{piece}` and it adds it to every encoding (`tokenizer(text).input_ids[0] == {token_id}`; "
            "`add_special_tokens=False` leaves it out).", "",
            "lm-evaluation-harness's HF backend then scores as Refinery does (its `RefineryLM`, equal "
            "per-request log-likelihoods): `lm_eval --model hf --model_args "
            f"pretrained=<this directory>{cut}; for loglikelihood_rolling (perplexity) tasks "
            "`pretrained=<this directory>,add_bos_token=False`, since lm-eval conditions a document on "
            f"`{piece}` itself and would also score the one the tokenizer adds, and without max_length "
            "(lm-eval's rolling windows are max_length long, Refinery's this model's context). Accuracy "
            "normalised by length: lm-eval's `acc_norm` divides by the choice's characters without its "
            "leading space, Refinery's `acc_norm` by its characters with the space (OLMES' acc_per_char); "
            "Refinery reports lm-eval's as `acc_norm_lm_eval`.", ""]


# Stages whose run-summary line holds what the machine did (tokens/s) or where it wrote (a report's path):
# the card writes their figures from the key-determined values only.
def _train_figures(committed) -> str:
    s = storage.read_json(committed.file("summary.json"))
    return (f"{s['params']:,} params, {s['steps']} steps, final loss {s['final_loss']:.3f}, "
            f"eval loss {s.get('eval_loss', float('nan')):.3f}")


def _evaluate_figures(committed) -> str:
    m = storage.read_json(committed.file("eval.json"))
    return (f"val loss {m['loss']:.3f} nats/token (unigram entropy {m['unigram_entropy']:.3f}), "
            f"{m['bits_per_byte']:.3f} bits/byte; yardsticks below")


FIGURES = {"train": _train_figures, "evaluate": _evaluate_figures}


def _summary(stage: str, committed) -> str:
    if committed is None:
        return ""
    try:
        stage = stage_of(stage)          # a source's own stage: clean[code] is a clean stage
        figures = FIGURES.get(stage) or importlib.import_module(f"stages.{stage}").summary
        line = figures(committed)
    except Exception as e:  # noqa: BLE001 - a figure the card cannot read must not fail the export
        log.warning("export: no summary of %s for the model card: %s: %s", stage, type(e).__name__, e)
        return ""
    return line.replace("|", "\\|")


def _evaluation(m: dict) -> list[str]:
    out = [f"- held-out loss of the run's own validation split: {m['loss']:.3f} nats/token "
           "(a training diagnostic: not comparable across data choices)"]
    factor = m.get("scoring", {}).get("moe_capacity_factor")
    if factor is not None:
        out.append("- scored dropless, every expert assignment, as this export runs" if not factor else
                   f"- scored with an expert capacity factor of {factor:g} (assignments past it dropped), "
                   "which this export does not do")
    for set_name, r in m.get("reference_bpb", {}).items():
        out.append(f"- reference text `{set_name}`: {r['bpb']:.3f} bits/byte, 95% interval "
                   f"[{r['low']:.3f}, {r['high']:.3f}]")
    for task, t in m.get("tasks", {}).items():
        a, h = t["acc_norm"], t.get("acc_norm_lm_eval")
        harness = f", lm-eval's acc_norm {h['value']:.3f} [{h['low']:.3f}, {h['high']:.3f}]" if h else ""
        out.append(f"- {task}: acc_norm (per character with the leading space) {a['value']:.3f} "
                   f"[{a['low']:.3f}, {a['high']:.3f}]{harness} (chance {t['random_baseline']:.2f})")
    return out


def _config_gin(inputs: Mapping) -> str:
    for stage in ("evaluate", "train"):
        committed = inputs.get(stage)
        if committed is not None and "config.gin" in committed.files:
            return storage.read_text(committed.file("config.gin"))
    return ""


def _params(mcfg) -> str:
    from stages.train.model_config import param_counts

    n = sum(param_counts(mcfg).values())
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"
