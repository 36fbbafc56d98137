"""report.md and its PNG plots, from eval.json's numbers, the samples and train's metrics.jsonl."""

from __future__ import annotations

import json
import math

from stages.io import figures, storage

YARDSTICK = "yardstick/"   # in-loop metrics' prefix (stages/yardsticks/score.py: PREFIX)

PLOTS = (  # file, title, y label, metrics.jsonl fields
    ("loss.png", "Loss", "nats / token", ("loss", "eval_loss")),
    ("learning_rate.png", "Learning rate", "learning rate", ("learning_rate",)),
    ("tokens_per_s.png", "Throughput", "tokens / s", ("tokens_per_s",)),
)


def read_metrics(path: str) -> list[dict]:
    return [json.loads(line) for line in storage.read_text(path).splitlines() if line.strip()]


def plots(rows: list[dict], out_dir: str) -> list[str]:
    """Writes one PNG per entry of PLOTS into out_dir; returns their file names."""
    written = []
    for name, title, ylabel, fields in PLOTS:
        fig, ax = figures.figure()
        for field in fields:
            pts = [(r["step"], r[field]) for r in rows if field in r and _finite(r[field])]
            if pts:
                ax.plot(*zip(*pts), marker="o" if len(pts) < 30 else None, markersize=3,
                        label=field.replace("_", " "))
        ax.set(title=title, xlabel="step", ylabel=ylabel)
        ax.grid(alpha=0.3)
        if len(fields) > 1:
            ax.legend()
        storage.write_bytes(storage.join(out_dir, name), figures.png(fig))
        written.append(name)
    return written + yardstick_plot(rows, out_dir) + moe_plot(rows, out_dir)


MOE_CURVES = ("moe/max_load", "moe/aux_loss", "moe/dropped")     # stages/train/loop.py: moe_row


def moe_plot(rows: list[dict], out_dir: str) -> list[str]:
    """moe.png for a mixture of experts: balance over training on the left (the most loaded expert's share
    x E, 1 = perfectly balanced; the balancing loss; the share of assignments dropped), each expert's share
    of the assignments at the last logged step on the right; [] for a dense model."""
    loads = [r for r in rows if "moe/load" in r]
    if not loads:
        return []
    fig, (left, right) = figures.figure(width=10, ncols=2)
    for name in MOE_CURVES:
        pts = [(r["step"], r[name]) for r in loads if name in r and _finite(r[name])]
        left.plot(*zip(*pts), marker="o" if len(pts) < 30 else None, markersize=3,
                  label=name.removeprefix("moe/").replace("_", " "))
    left.set(title="Expert balance", xlabel="step", ylabel="1 = balanced (max load x E, aux loss)")
    last = loads[-1]["moe/load"]
    right.bar(range(len(last)), last)
    right.axhline(1 / len(last), color="black", linewidth=0.8, linestyle="--", label="equal share")
    right.set(title=f"Load per expert at step {loads[-1]['step']}", xlabel="expert", ylabel="share of tokens")
    for ax in (left, right):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    storage.write_bytes(storage.join(out_dir, "moe.png"), figures.png(fig))
    return ["moe.png"]


def yardstick_plot(rows: list[dict], out_dir: str) -> list[str]:
    """yardsticks.png, the in-loop curves (rows' `yardstick/...` entries, `yardsticks/score.py`): reference
    bits per byte on the left, per-character task accuracy and the aggregate centered accuracy on the
    right; [] when training scored none."""
    names = sorted({k for r in rows for k in r if k.startswith(YARDSTICK)})
    if not names:
        return []
    fig, (left, right) = figures.figure(width=10, ncols=2)
    for name in names:
        pts = [(r["step"], r[name]) for r in rows if name in r and _finite(r[name])]
        kind, _, label = name[len(YARDSTICK):].partition("/")
        if kind == "bpb":
            left.plot(*zip(*pts), marker="o", markersize=3, label=label)
        elif kind in ("acc_norm", "aggregate"):
            right.plot(*zip(*pts), marker="o", markersize=3, label=label or "aggregate (centered)",
                       linewidth=2.5 if kind == "aggregate" else 1.2)
    left.set(title="Reference text (in the loop)", xlabel="step", ylabel="bits / byte")
    right.set(title="Downstream tasks (in the loop)", xlabel="step", ylabel="acc_norm; aggregate: centered")
    for ax in (left, right):
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=7)
    storage.write_bytes(storage.join(out_dir, "yardsticks.png"), figures.png(fig))
    return ["yardsticks.png"]


def samples_text(samples: list[dict]) -> str:
    out = []
    for s in samples:
        out.append(f"=== prompt: {s['prompt']!r}\n--- greedy:\n{s['greedy']}\n"
                   f"--- temperature {s['temperature']}:\n{s['sampled']}\n")
    return "\n".join(out)


def markdown(m: dict, samples: list[dict], plot_files: list[str], train_path: str) -> str:
    learned = m["loss"] < m["unigram_entropy"]
    lines = [
        "# Evaluation report",
        "",
        f"Model: `{train_path}`",
        "",
        "| metric | value |",
        "|---|---|",
        f"| val loss (nats/token) | {m['loss']:.4f} |",
        f"| unigram entropy of the training tokens (nats/token) | {m['unigram_entropy']:.4f} |",
        f"| perplexity | {m['perplexity']:.2f} |",
        f"| bits per byte | {m['bits_per_byte']:.4f} |",
        f"| val tokens evaluated | {m['tokens']:,} |",
        f"| eval throughput (tokens/s) | {m['tokens_per_s']:,.0f} |",
        "",
        ("The model beats the unigram baseline by "
         f"{m['unigram_entropy'] - m['loss']:.3f} nats/token: it uses context." if learned else
         "The model does **not** beat the unigram baseline: it has not learned to use context."),
        "",
    ]
    lines += source_table(m)
    refs = m.get("reference_bpb", {})
    if refs:
        lines += ["## Reference text (bits per byte)", "",
                  "Fixed documents that no data, clean or tokenizer setting changes, scored with rolling "
                  "windows over their UTF-8 bytes: comparable across variants. 95% interval: bootstrap "
                  "over documents.", "",
                  "| set | bits/byte | 95% interval | documents | bytes |", "|---|---|---|---|---|"]
        lines += [f"| {name} | {r['bpb']:.4f} | {r['low']:.4f} - {r['high']:.4f} | {r['docs']} | "
                  f"{r['bytes']:,} |" for name, r in refs.items()]
        lines += [""]
    lines += task_table(m)
    lines += scoring_lines(m)
    lines += contamination_table(m)
    lines += ["## Training curves", ""]
    lines += [f"![{f}]({f})" for f in plot_files]
    lines += ["", "## Samples", ""]
    for s in samples:
        lines += [f"**{s['prompt']!r}**", "", f"- greedy: `{_one_line(s['greedy'])}`",
                  f"- temperature {s['temperature']}: `{_one_line(s['sampled'])}`", ""]
    return "\n".join(lines) + "\n"


def source_table(m: dict) -> list[str]:
    """report.md's sources of a mixture: each one's own validation split (the figures above pool them)."""
    sources = m.get("sources", {})
    if not sources:
        return []
    lines = ["## Sources (each one's validation split)", "",
             "Each source's held-out text in its own shards: a diagnostic of what the mixture taught, not a "
             "yardstick (another mixture's sources are other text).", "",
             "| source | val loss | bits per byte | val tokens | val bytes | documents kept by clean | "
             "characters kept |", "|---|---|---|---|---|---|---|"]
    for name, s in sources.items():
        c = s.get("clean")
        kept = (f"{c['docs_kept']:,} of {c['docs_in']:,} | {c['chars_kept']:,} of {c['chars_in']:,}" if c else
                " | ")
        lines.append(f"| {name} | {s['loss']:.4f} | {s['bits_per_byte']:.4f} | {s['tokens']:,} | "
                     f"{s['val_bytes']:,} | {kept} |")
    return lines + [""]


def task_table(m: dict) -> list[str]:
    """report.md's downstream tasks: a row per task, each figure with its 95% interval, and the aggregate."""
    scores = m.get("tasks", {})
    if not scores:
        return []
    lines = ["## Downstream tasks (zero-shot multiple choice)", "",
             "acc: the gold choice has the highest log-likelihood; acc_norm: per character of the choice; "
             "centered: (acc - random) / (1 - random), 0 at chance. [95% interval]: bootstrap over items.",
             "", "| task | items | acc | acc_norm | centered | random baseline |",
             "|---|---|---|---|---|---|"]
    for name, t in scores.items():
        lines.append(f"| {name} | {t['items']} | {_ci(t['acc'])} | {_ci(t['acc_norm'])} | "
                     f"{_ci(t['centered'])} | {t['random_baseline']:.3f} |")
    a = m["aggregate"]
    lines += ["", f"Aggregate ({a['metric']} accuracy, mean over {len(a['tasks'])} tasks): "
              f"{a['value']:.3f} [{a['low']:.3f}, {a['high']:.3f}].",
              "", "A tiny model is expected near chance; an interval of acc that holds the random baseline "
              "(of centered, one that holds 0) says it is indistinguishable from chance on that task.", ""]
    return lines


def scoring_lines(m: dict) -> list[str]:
    """report.md's "how these were scored": lm-eval's max_length the task requests were cut by, and for a
    mixture of experts whether the model was scored dropless (the exported model) or with drops."""
    s = m.get("scoring")
    if not s:
        return []
    n = s["max_length"]
    lines = [f"Task requests are cut as lm-eval's HF backend cuts them with max_length={n} (the last "
             "max_length + 1 tokens of context + answer): `lm_eval --model hf --model_args "
             f"pretrained=<export>,max_length={n}` gives these log-likelihoods."] if m.get("tasks") else []
    if "moe_capacity_factor" in s:
        factor, trained = s["moe_capacity_factor"], s["trained_moe_capacity_factor"]
        routed = ("dropless (every expert assignment), as the exported model runs in transformers, vLLM and "
                  "llama.cpp" if not factor else
                  f"with an expert capacity factor of {factor:g} (assignments past it dropped), not as the "
                  "exported model runs (dropless)")
        how = f"capacity factor {trained:g}" if trained else "dropless routing"
        lines.append(f"The mixture of experts (trained with {how}) is scored {routed}.")
    return [" ".join(lines), ""] if lines else []


def contamination_table(m: dict) -> list[str]:
    """report.md's contamination check: per yardstick scored, how many of its items the cleaned training text
    holds (clean's contamination.json: a shared 13-gram, or a shorter item whole), and whether clean dropped
    those documents; a yardstick clean did not check says so."""
    found = m.get("contamination", {})
    if "sources" in m:        # a mixture: each source's clean checked its own text
        found = {f"{name} ({source})": c for source, per in found.items() for name, c in per.items()}
    if not found:
        return []
    lines = ["## Contamination (training text that holds a yardstick)", "",
             "Items of each yardstick scored (a task's context and gold answer, a reference document) found "
             "in the cleaned training documents: a shared word n-gram (GPT-3's 13-gram test), or, for an "
             "item shorter than n words, the whole item. A contaminated item's score may be memorized rather "
             "than learned; `clean.Contamination.drop = True` removes those documents from training.", "",
             "| yardstick | n | items | shorter than n (matched whole) | contaminated items | training "
             "documents | dropped |",
             "|---|---|---|---|---|---|---|"]
    for name, c in found.items():
        if not c.get("checked", True):
            lines.append(f"| {name} | not checked | | | | | |")
            continue
        dropped = "yes" if c["dropped"] else "no"
        lines.append(f"| {name} | {c['n']} | {c['items']:,} | {c.get('short_items', 0):,} | "
                     f"{c['items_contaminated']:,} | {c['docs_contaminated']:,} | {dropped} |")
    return lines + [""]


def _ci(metric: dict) -> str:
    return f"{metric['value']:.3f} [{metric['low']:.3f}, {metric['high']:.3f}]"


def _one_line(text: str) -> str:
    return text.replace("\n", "⏎").replace("`", "'")


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)
