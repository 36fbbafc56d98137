"""The exported model's card (README.md): what made the model and how it scored, from the run's own outputs.

    card.model_card("refinery-3f2a", inputs, model_config)   # markdown

It records every stage's cache key (from the upstream manifests, download's included), each stage's
one-line summary (the data recipe's figures: documents kept and dropped by reason, tokens; the
tokenizer's bytes per token; training's loss and throughput; the evaluation's yardsticks with their
intervals), and the gin config the keys cover, so the run can be reproduced from the card alone.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Mapping

from stages.io import storage

log = logging.getLogger(__name__)


def model_card(name: str, inputs: Mapping, mcfg) -> str:
    keys = stage_keys(inputs)
    lines = ["---", "library_name: transformers", "pipeline_tag: text-generation",
             "tags: [refinery, llama]", "---", "", f"# {name}", "",
             f"A Llama-architecture decoder ({_params(mcfg)} parameters: "
             f"{mcfg.n_layers} layers, d_model {mcfg.d_model}, {mcfg.n_heads} heads / {mcfg.n_kv_heads} kv "
             f"heads, vocabulary {mcfg.vocab_size:,}, context {mcfg.max_seq_len:,}) trained from raw text by "
             "Refinery's cached pipeline. Load it with transformers:", "", "```python",
             "from transformers import AutoModelForCausalLM, AutoTokenizer",
             'model = AutoModelForCausalLM.from_pretrained("<this directory or hub id>")',
             'tokenizer = AutoTokenizer.from_pretrained("<this directory or hub id>")', "```", "",
             "## The run", "", "| stage | cache key | figures |", "|---|---|---|"]
    for stage, key in keys.items():
        lines.append(f"| {stage} | `{key}` | {_summary(stage, inputs.get(stage))} |")
    lines += ["", "Every figure above is read from that stage's committed output; the keys identify the "
              "outputs (`<cache_root>/<stage>/<key>/`)."]
    evaluation = inputs.get("evaluate")
    if evaluation is not None and "eval.json" in evaluation.files:
        lines += ["", "## Evaluation", "", *_evaluation(storage.read_json(evaluation.file("eval.json")))]
    gin = _config_gin(inputs)
    if gin:
        lines += ["", "## Configuration", "", "The gin bindings the cache keys cover:", "", "```",
                  gin.strip(), "```"]
    return "\n".join(lines) + "\n"


def stage_keys(inputs: Mapping) -> dict[str, str]:
    """stage -> key for every stage the inputs came from, directly or through their manifests (download is
    clean's upstream only), each after the stages it read."""
    keys: dict[str, str] = {}
    reads: dict[str, set[str]] = {}
    for stage, committed in inputs.items():
        keys[stage] = committed.key
        upstream = committed.manifest.get("upstream", {})
        reads[stage] = set(upstream)
        for name, key in upstream.items():
            keys.setdefault(name, key)
    ordered: list[str] = []

    def visit(stage: str) -> None:
        if stage not in ordered:
            for name in sorted(reads.get(stage, ())):
                visit(name)
            ordered.append(stage)

    for stage in keys:
        visit(stage)
    return {stage: keys[stage] for stage in ordered}


def _summary(stage: str, committed) -> str:
    if committed is None:
        return ""
    try:
        line = importlib.import_module(f"stages.{stage}").summary(committed)
    except Exception as e:  # noqa: BLE001 - a figure the card cannot read must not fail the export
        log.warning("export: no summary of %s for the model card: %s: %s", stage, type(e).__name__, e)
        return ""
    return line.replace("|", "\\|")


def _evaluation(m: dict) -> list[str]:
    out = [f"- held-out loss of the run's own validation split: {m['loss']:.3f} nats/token "
           "(a training diagnostic: not comparable across data choices)"]
    for set_name, r in m.get("reference_bpb", {}).items():
        out.append(f"- reference text `{set_name}`: {r['bpb']:.3f} bits/byte, 95% interval "
                   f"[{r['low']:.3f}, {r['high']:.3f}]")
    for task, t in m.get("tasks", {}).items():
        a = t["acc_norm"]
        out.append(f"- {task}: acc_norm {a['value']:.3f} [{a['low']:.3f}, {a['high']:.3f}] "
                   f"(chance {t['random_baseline']:.2f})")
    return out


def _config_gin(inputs: Mapping) -> str:
    for stage in ("evaluate", "train"):
        committed = inputs.get(stage)
        if committed is not None and "config.gin" in committed.files:
            return storage.read_text(committed.file("config.gin"))
    return ""


def _params(mcfg) -> str:
    from stages.train.configs import param_counts

    n = sum(param_counts(mcfg).values())
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"
