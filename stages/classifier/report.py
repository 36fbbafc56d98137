"""The classifier stage's report.md (and roc.png): report.json's figures, readable.

    report.write(out_dir, report, labels, scores)    # labels (N,) 1/0 and scores (N,) of the held-out docs

Imported only when the stage runs (matplotlib loads for the ROC curve, and only when there are held-out
documents of both classes to draw it from).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from stages.classifier import metrics
from stages.io import figures, storage

ROC_FILE = "roc.png"


def write(out_dir: str, report: dict, labels: Sequence[int] = (), scores: Sequence[float] = ()) -> None:
    """Writes report.md, and roc.png when `labels` hold both classes."""
    lines = [f"# Quality classifier ({report['mode']})", ""]
    if report["mode"] == "off":
        lines += ["Off: classifier.Config names no positives, negatives or pretrained file, so no score is "
                  "computed (`classifier.scorer` gives None).", ""]
        storage.write_text(storage.join(out_dir, "report.md"), "\n".join(lines))
        return
    pos, neg = report["positive_label"], report["negative_label"]
    model = report["model"]
    if report["mode"] == "pretrained":
        lines += [f"Published classifier `{report['pretrained']}` (sha256 `{model['sha256']}`), used as it "
                  f"is; the score is the probability of `{pos}`."]
    else:
        hp = ", ".join(f"{k}={v}" for k, v in report["hyperparameters"].items())
        lines += [f"Trained with fastText's supervised trainer: {hp}. The score is the probability of "
                  f"`{pos}` (positives) against `{neg}` (negatives)."]
    lines += ["", f"Model: labels {model['labels']}, {model['words']:,} words, dim {model['dim']}, "
              f"word n-grams {model['word_ngrams']}, {model['bucket']:,} hash buckets, "
              f"{model['bytes'] / 1e6:.1f} MB.", ""]
    if report.get("docs_read"):
        lines += ["| | positives | negatives |", "|---|---:|---:|"]
        for name, key in (("documents read", "docs_read"), ("trained on", "train"), ("held out", "holdout")):
            row = report.get(key) or {}
            lines.append(f"| {name} | {row.get('positives', 0):,} | {row.get('negatives', 0):,} |")
        lines += ["", f"Contaminated positives dropped (they share text with a yardstick): "
                      f"{report['contamination']['positives_dropped']:,} "
                      f"(checked: {', '.join(report['contamination']['checked']) or 'none'}).", ""]
    held = report.get("holdout_metrics")
    if held:
        lines += ["## Held-out documents", "",
                  f"ROC AUC {_figure(held['roc_auc'])}; at score >= {held['threshold']}: precision "
                  f"{_figure(held['precision'])}, recall {_figure(held['recall'])} "
                  f"({held['docs']:,} documents never trained on).", ""]
        if metrics.roc_auc(labels, scores) is not None:
            fpr, tpr = metrics.roc_curve(labels, scores)
            fig, ax = figures.figure(width=4.5, height=4)
            ax.plot(fpr, tpr, drawstyle="steps-post")
            ax.plot([0, 1], [0, 1], linestyle=":", color="grey")
            ax.set(xlabel="false positive rate", ylabel="true positive rate",
                   title=f"ROC, held out (AUC {held['roc_auc']:.3f})")
            storage.write_bytes(storage.join(out_dir, ROC_FILE), figures.png(fig))
            lines += [f"![ROC curve]({ROC_FILE})", ""]
    ngrams = report["ngrams"]
    lines += ["## Word n-grams by weight", "", ngrams["method"] + ".", ""]
    if ngrams.get("skipped"):
        lines += [f"Not listed: {ngrams['skipped']}.", ""]
    for title, key in ((f"Most `{pos}`", "most_positive"), ("Most against it", "most_negative")):
        lines += [f"**{title}**", "", "| n-gram | weight | count |", "|---|---:|---:|"]
        lines += [f"| {_code(row['ngram'])} | {row['weight']:+.4g} | {row['count']:,} |"
                  for row in ngrams[key]]
        lines.append("")
    storage.write_text(storage.join(out_dir, "report.md"), "\n".join(lines))


def _code(text: str) -> str:
    """`text` as a code span in a table cell: "|" escaped, and a span fence longer than any run of backticks
    in it (a web page's word can hold both)."""
    fence = "`" * (max(map(len, re.findall("`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text.replace('|', chr(92) + '|')}{pad}{fence}"


def _figure(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"
