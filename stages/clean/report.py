"""The clean stage's `report.md` and `removed.png`: what each step removed, in pipeline order.

    report.write(out_dir, stats, config, download)     # clean.run calls it after the Beam graph

Reads what the stage already wrote (`stats` is stats.json, samples from `rejected/<reason>.jsonl`) and
writes into `out_dir`:

    removed.png   documents and characters removed per reason, two panels, in pipeline order
    report.md     the same numbers as a table, the kept documents and characters, the filters that
                  ran, the yardstick overlap per yardstick (contamination.json, when the check ran),
                  and the sampled rejected documents of every reason (id, url, first 300 chars)

Pipeline order (`ordered_reasons`) is the order in which a document meets the steps: download's
errors (the names in download's stats.json), `null_text`, `empty`, the filters of
`build_filters` (config.py) in order (each lists its reasons, `Filter.reasons()`), `duplicate`,
`near_duplicate`, `contaminated` (contamination.py). A reason no step names (a filter without
`reasons()`, a download error when download's stats.json is not there) comes last, alphabetically.
"""

from __future__ import annotations

import json
import re

from stages.clean import contamination, tally
from stages.clean.config import Config, build_filters
from stages.io import figures, storage

EXCERPT_CHARS = 300          # of each rejected document shown in report.md
UNKNOWN = "other"           # the step of a reason that no step names
META_FIELDS, META_CHARS = 4, 40   # a sample's metadata summary: its first fields, each value cut to this
# CommonMark lets a backslash escape any ASCII punctuation; these are the ones that can start markup
# inside a line (emphasis, code, links and images, HTML, entities, table cells, strikethrough) in a
# sample's text, url or id. Line-start markup (#, -, 1.) cannot occur: each sample follows "- **id**".
_MARKUP = re.compile(r"([\\`*_\[\]<>&|~])")


def write(out_dir: str, stats: dict, config: Config, download=None) -> None:
    """Writes removed.png and report.md for the clean output in `out_dir` (`stats`: its stats.json;
    `download`: the committed score (or download) stage, whose stats.json names the download errors)."""
    order = ordered_reasons(stats, steps(config, download_errors(download)))
    samples = {reason: read_samples(out_dir, reason) for _, reason in order}
    storage.write_bytes(storage.join(out_dir, "removed.png"), chart(stats, order))
    found_path = storage.join(out_dir, contamination.FILE)
    found = storage.read_json(found_path) if storage.exists(found_path) else {}
    storage.write_text(storage.join(out_dir, "report.md"), markdown(stats, order, samples, config, found))


def download_errors(download) -> tuple[str, ...]:
    """The error names in download's stats.json (() when it has none, or no stats.json)."""
    if download is None or "stats.json" not in getattr(download, "files", {}):
        return ()
    return tuple(sorted(storage.read_json(download.file("stats.json")).get("errors", {})))


def steps(config: Config, errors: tuple[str, ...] = ()) -> list[tuple[str, tuple[str, ...]]]:
    """[(step, the reasons it can give, in order)] in the order a document meets the steps."""
    out = [("download", errors), ("text", ("null_text", "empty"))]
    for f in build_filters(config):
        reasons = getattr(f, "reasons", None)
        out.append((type(f).__name__, tuple(reasons()) if reasons else ()))
    if config.keep_top is not None:
        out.append(("KeepTop", config.keep_top.reasons()))
    return out + [("dedup", ("duplicate",)), ("minhash", ("near_duplicate",)),
                  ("contamination", (contamination.REASON,))]


def ordered_reasons(stats: dict, steps_: list[tuple[str, tuple[str, ...]]]) -> list[tuple[str, str]]:
    """[(step, reason)] for every reason in stats.json's `dropped`: by the first step that names it,
    then the reasons no step names, alphabetically, under `UNKNOWN`."""
    dropped = stats["dropped"]
    out, seen = [], set()
    for step, reasons in steps_:
        for reason in reasons:
            if reason in dropped and reason not in seen:
                out.append((step, reason))
                seen.add(reason)
    return out + [(UNKNOWN, reason) for reason in sorted(dropped) if reason not in seen]


def ordered_rewrites(stats: dict, config: Config) -> list[tuple[str, str]]:
    """[(step, kind)] for every kind in stats.json's `rewritten` (absent before it was counted), in the
    order of the filters that name it (`Rewriter.rewrites()`), then the others alphabetically (a
    rewriter without `rewrites()` counts under its class name, which is then its step)."""
    rewritten = stats.get("rewritten", {})
    out: dict[str, str] = {}                     # kind -> step, in order
    for f in build_filters(config):
        step = type(f).__name__
        for kind in (*getattr(f, "rewrites", tuple)(), step):
            if kind in rewritten:
                out.setdefault(kind, step)
    for kind in sorted(rewritten):
        out.setdefault(kind, UNKNOWN)
    return [(step, kind) for kind, step in out.items()]


def read_samples(out_dir: str, reason: str) -> list[dict]:
    path = storage.join(out_dir, "rejected", f"{tally.file_name(reason)}.jsonl")
    if not storage.exists(path):
        return []
    # Split on "\n" alone: the samples are written with ensure_ascii=False, so an id, URL or text may hold
    # U+2028, U+2029 or NEL unescaped, and str.splitlines would cut a sample there.
    return [json.loads(line) for line in storage.read_text(path).split("\n") if line.strip()]


def chart(stats: dict, order: list[tuple[str, str]]) -> bytes:
    """Two horizontal bar panels (documents, characters removed per reason), first step on top."""
    n = max(len(order), 1)
    fig, (docs_ax, chars_ax) = figures.figure(width=10, height=1.4 + 0.26 * n, ncols=2)
    labels = [f"{reason} ({step})" for step, reason in order]
    ys = list(range(len(order)))
    panels = ((docs_ax, stats["dropped"], "documents removed", stats["docs_in"], stats["docs_kept"], "docs"),
              (chars_ax, stats["dropped_chars"], "characters removed", stats["chars_in"], stats["chars_kept"],
               "chars"))
    step_colors = {step: f"C{i % 10}" for i, step in enumerate(dict.fromkeys(step for step, _ in order))}
    for ax, counts, xlabel, total, kept, unit in panels:
        values = [counts.get(reason, 0) for _, reason in order]
        ax.barh(ys, values, color=[step_colors[step] for step, _ in order])   # one colour per step
        for y, v in zip(ys, values):
            ax.annotate(f"{v:,}", (v, y), xytext=(3, 0), textcoords="offset points", va="center", fontsize=7)
        ax.set(xlabel=xlabel, title=f"kept {kept:,} of {total:,} {unit}")
        ax.set_yticks(ys, labels if ax is docs_ax else [])
        ax.invert_yaxis()                 # the first step on top
        ax.grid(axis="x", alpha=0.3)
        ax.margins(x=0.15)
        if not order:
            ax.text(0.5, 0.5, "nothing removed", transform=ax.transAxes, ha="center", va="center")
    return figures.png(fig)


def markdown(stats: dict, order: list[tuple[str, str]], samples: dict[str, list[dict]],
             config: Config, found: dict | None = None) -> str:
    """report.md; `found` is contamination.json ({} or None: the check did not run)."""
    docs_in, chars_in = stats["docs_in"], stats["chars_in"]
    removed_chars = sum(stats["dropped_chars"].values())
    lines = [
        "# Clean report",
        "",
        f"Kept **{stats['docs_kept']:,}** of {docs_in:,} documents ({_pct(stats['docs_kept'], docs_in)}) and "
        f"**{stats['chars_kept']:,}** of {chars_in:,} characters ({_pct(stats['chars_kept'], chars_in)}), "
        f"in {stats['shards']} shards.",
        "",
        "Filters, in the order they run: " + (", ".join(f"`{type(f).__name__}`"
                                                         for f in build_filters(config)) or "none")
        + f"; exact dedup {'on' if config.dedup else 'off'}, MinHash near-dedup "
        f"{'on' if config.minhash else 'off'}. A document is counted under the first reason that applies.",
        "",
        "![documents and characters removed per reason](removed.png)",
        "",
        "| step | reason | documents | % of docs in | characters | % of chars in |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for step, reason in order:
        docs, chars = stats["dropped"][reason], stats["dropped_chars"].get(reason, 0)
        lines.append(f"| {step} | {_code(reason)} | {docs:,} | {_pct(docs, docs_in)} | {chars:,} | "
                     f"{_pct(chars, chars_in)} |")
    # Normalization and C4's line filter shorten the documents they keep.
    rewritten = chars_in - stats["chars_kept"] - removed_chars
    lines += [f"| kept | (text removed from kept documents) | | | {rewritten:,} | "
              f"{_pct(rewritten, chars_in)} |",
              f"| kept | | {stats['docs_kept']:,} | {_pct(stats['docs_kept'], docs_in)} | "
              f"{stats['chars_kept']:,} | {_pct(stats['chars_kept'], chars_in)} |", ""]
    rewrites = ordered_rewrites(stats, config)
    if rewrites:
        lines += ["Kept documents whose text a step rewrote (a document counts once per kind):", "",
                  "| step | rewrite | documents | % of docs kept |", "|---|---|---:|---:|"]
        for step, kind in rewrites:
            docs = stats["rewritten"][kind]
            lines.append(f"| {step} | {_code(kind)} | {docs:,} | {_pct(docs, stats['docs_kept'])} |")
        lines.append("")
    if found:
        check = config.contamination
        lines += [f"Yardstick overlap ({check.n}-grams of normalized words shared with a kept document; "
                  f"{'dropped as `contaminated`' if check.drop else 'reported, not dropped'}: "
                  "contamination.json):", "",
                  "| yardstick | kind | items | items contaminated | documents contaminated | e.g. |",
                  "|---|---|---:|---:|---:|---|"]
        for name, got in found.items():
            example = ", ".join(f"{_escape(e['item'])} in {_escape(str(e['doc']))}"
                                for e in got["examples"][:2])
            lines.append(f"| {name} | {got['kind']} | {got['items']:,} | {got['items_contaminated']:,} | "
                         f"{got['docs_contaminated']:,} | {example} |")
        lines.append("")
    lines += ["## Rejected samples", "",
              f"Up to {config.samples_per_reason} per reason, smallest ids first, the first {EXCERPT_CHARS} "
              "characters of the text as the filter saw it (⏎ marks a line break).", ""]
    for step, reason in order:
        shown = samples.get(reason, [])
        file = f"rejected/{tally.file_name(reason)}.jsonl"
        lines += [f"### {_code(reason)} ({step}): {stats['dropped'][reason]:,} dropped", ""]
        if shown:
            lines += [f"{len(shown)} shown, from [{file}]({file}):", ""]
        for s in shown:
            text = s.get("text")
            excerpt = "(no text)" if text is None else _escape(_one_line(text[:EXCERPT_CHARS])) + (
                "…" if len(text) > EXCERPT_CHARS else "")
            url = f" {_escape(str(s['url']))}" if s.get("url") else ""
            meta = metadata_summary(s.get("metadata"))
            meta = f" ({_escape(meta)})" if meta else ""
            lines.append(f"- **{_escape(str(s.get('id')))}**{url}{meta}: {excerpt}")
        lines.append("")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Plotting as stages/evaluate/report.py does it (Agg backend, tight PNG, figure closed); a near-copy
# so that a data stage does not import the evaluation stage.

def metadata_summary(metadata) -> str:
    """A sample's metadata (the JSON object string of the `metadata` column, or a dict) in one short line:
    `dump=CC-MAIN-2024-10, language=en, +3 more`; "" for none (samples that carry no metadata)."""
    if isinstance(metadata, str):
        try:
            metadata = json.loads(metadata)
        except ValueError:
            return ""
    if not isinstance(metadata, dict) or not metadata:
        return ""
    items = []
    for key in sorted(metadata)[:META_FIELDS]:
        value = metadata[key]
        value = value if isinstance(value, str) else json.dumps(value, sort_keys=True, ensure_ascii=False)
        value = _one_line(value)
        items.append(f"{key}={value[:META_CHARS]}{'…' if len(value) > META_CHARS else ''}")
    more = len(metadata) - META_FIELDS
    return ", ".join(items) + (f", +{more} more" if more > 0 else "")


def _escape(text: str) -> str:
    return _MARKUP.sub(r"\\\1", text)


def _code(reason: str) -> str:
    """A reason as inline code, or escaped text when it holds what would end the code or the table cell
    (download errors are data; backslashes are literal inside code)."""
    return _escape(reason) if "`" in reason or "|" in reason else f"`{reason}`"


def _one_line(text: str) -> str:
    return " ⏎ ".join(text.splitlines())


def _pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "–"
