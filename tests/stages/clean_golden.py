"""What clean wrote before it was split into score and selection, to hold the split to it byte for byte.

    # rewrites tests/data/clean_before_split.json
    PYTHONPATH=$PWD .venv/bin/python -m tests.stages.clean_golden

`tests/data/clean_before_split.json` was written by this module run on the one-pass clean stage (commit
96936bb, clean VERSION 8), for the inputs and configs below: per config, each output file's content digest
(`digests`: parquet files by their rows, JSON by its parsed value, text as text; removed.png, whose bytes
are matplotlib's, is left out). tests/stages/test_score.py runs today's score + clean on the same inputs and
compares. Run it again only when a change to clean's output is intended (and clean's VERSION bumped).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys

from pipeline import cache
from stages import clean
from stages.clean import c4, fineweb, gopher, langid, pii, urls
from stages.io import documents, storage

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "data")
GOLDEN = os.path.join(DATA, "clean_before_split.json")


def _lines(name: str) -> list[dict]:
    with open(os.path.join(DATA, name)) as f:
        return [json.loads(line) for line in f]


def shards() -> list[list[dict]]:
    """Real web text (tests/data/cc_excerpts.jsonl, langid_excerpts.jsonl) in three download shards, with
    exact copies under other ids, near copies (a line added), download errors, empty and tiny texts."""
    web = [{"id": d["id"], "text": d["text"], "url": d.get("url"), "source": "cc"}
           for d in _lines("cc_excerpts.jsonl")]
    lang = [{"id": f"lang-{i}", "text": d["text"], "source": "langid"}
            for i, d in enumerate(_lines("langid_excerpts.jsonl"))]
    copies = [{**d, "id": f"copy-{i}", "text": "  " + d["text"] + "\n\n"} for i, d in enumerate(web[:12])]
    near = [{**d, "id": f"near-{i}", "text": d["text"] + "\nOne more line at the end of the page."}
            for i, d in enumerate(web[12:24])]
    odd = [{"id": "err", "text": None, "error": "malformed_json"}, {"id": "null", "text": None},
           {"id": "blank", "text": " \t\n "}, {"id": "tiny", "text": "tiny"},
           {"id": "mail", "text": "Write to someone@example.com or 8.8.8.8 for help. " * 10}]
    # a page that holds a yardstick item (the first reference set's first), and a copy of it
    from stages import yardstick_data
    from stages.yardstick_data import texts
    item = next(iter(texts.texts(yardstick_data.REFERENCE_SETS, (), None).values()))[0][1]
    leaked = [{**web[30], "id": f"leak-{i}", "text": web[30]["text"] + "\n\n" + item + "\n" * i}
              for i in range(2)]
    every = web + lang + copies + near + odd + leaked
    return [every[0::3], every[1::3], every[2::3]]


def configs() -> dict[str, clean.Config]:
    recipe = {"url_filter": urls.URLFilter(), "language_id": langid.LanguageID(),
              "gopher_repetition": gopher.GopherRepetition(), "gopher_quality": gopher.GopherQuality(),
              "c4_quality": c4.C4Quality(), "fineweb_quality": fineweb.FineWebQuality(),
              "pii_masking": pii.PIIMasker()}
    return {"defaults": clean.Config(num_shards=3),
            "fineweb": clean.Config(num_shards=3, samples_per_reason=3, **recipe,
                                    contamination=clean.Contamination(drop=True)),
            "loose": clean.Config(num_shards=2, min_chars=50, min_alpha_fraction=0.0, dedup=False,
                                  gopher_quality=gopher.GopherQuality(min_doc_words=20),
                                  contamination=clean.Contamination(drop=True))}


def run(root: str, name: str, config: clean.Config):
    """The clean output of `config` on `shards()` in the cache at `root` (download written directly)."""
    parts = shards()

    def write(_config, _inputs, out_dir, _work_dir):
        for i, docs in enumerate(parts):
            documents.write(storage.join(out_dir, documents.shard_name(i, len(parts))), docs)
    download = cache.run_stage(cache_root=root, stage="download", key="golden", config=clean.Config(),
                               upstream={}, fn=write)
    return cache.run_stage(cache_root=root, stage="clean", key=name, config=clean.follow(
        config, {"yardsticks": _yardsticks()}), upstream={"download": download}, fn=clean.run)


def _yardsticks():
    from stages import yardsticks
    return yardsticks.Config()


def digests(done) -> dict[str, str]:
    """{output file: sha256 of its content} of a committed clean, removed.png left out."""
    out = {}
    for name in sorted(done.files):
        if name in ("removed.png",) or name.startswith("_") or name == "config.gin":
            continue
        path = done.file(name)
        if name.endswith(".parquet"):
            content = json.dumps(list(documents.read(path)), sort_keys=True)
        elif name.endswith(".json"):
            content = json.dumps(storage.read_json(path), sort_keys=True)
        else:
            content = storage.read_text(path)
        out[name] = hashlib.sha256(content.encode()).hexdigest()
    return out


def main(root: str) -> None:
    golden = {name: digests(run(root, name, config)) for name, config in configs().items()}
    with open(GOLDEN, "w") as f:
        json.dump(golden, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"wrote {GOLDEN}: {', '.join(f'{k} ({len(v)} files)' for k, v in golden.items())}")


if __name__ == "__main__":
    import tempfile
    main(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp())
