"""The data half (download -> clean -> tokenizer -> shard) at growing corpus sizes: wall time and the peak
resident memory of the whole process tree, with FineWeb's filters and MinHash on.

    .venv/bin/python -m benchmarks data_scaling                       # 8, 32 and 128 MB of text
    .venv/bin/python -m benchmarks.data_scaling --sizes 64,256,1024   # the issue's bar: the largest >= 1 GB

Each corpus is unique real text: the sentences of the real pages the benchmarks hold (the shared Common
Crawl sample when `../shared/data` is here, and benchmarks/data's pypi pages) recombined at random into
documents of 2-6 KB, each with its own URL, written as jsonl.gz files of ~16 MB (`download.Files`). Every
document is new text, so exact dedup keeps them and MinHash finds few near duplicates: the stages do their
full work at every size. The pipeline runs as `python -m pipeline run --stage shard` in a child process;
this one samples the resident memory (RSS) of that process and all its descendants (Beam's workers too)
every 0.2 s and keeps the largest sum. What the bar asks (issue 28): time linear in the corpus, and the
peak at the largest size within 1.5x of the smallest's (`peak_ratio`).
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import random
import re
import subprocess
import sys
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIZES_MB = (8, 32, 128)
FILE_BYTES = 16 * 2**20
SHARD_MB = 16            # download's and clean's num_shards: one per this many MB of text (4 at least)
BAR_PEAK_RATIO = 1.5
PYPI = os.path.join(REPO, "benchmarks", "data", "pypi_pages.jsonl.gz")
CC = os.path.join(REPO, "..", "shared", "data", "cc-main-2019-30-sample.jsonl.gz")
GIN = [os.path.join(REPO, "gin", "tiny.gin"), os.path.join(REPO, "gin", "data", "fineweb_filters.gin")]
RUN = [  # the data half with FineWeb's recipe on local jsonl (tiny.gin's sizes for tokenizer and shard)
    "download.Config.source = @download.Files()",
    "download.Files.url_field = 'url'",
    "clean.Config.language_id = None",     # the recombined sentences are in many languages: keep them all
    "tokenizer.Config.vocab_size = 4096",
]


def measure(work_dir: str, sizes_mb=SIZES_MB) -> dict:
    sentences = _sentences()
    rows = []
    for mb in sizes_mb:
        corpus = os.path.join(work_dir, f"corpus-{mb}mb")
        docs = _write_corpus(corpus, sentences, mb * 2**20, seed=mb)
        shards = max(4, mb // SHARD_MB)       # shards of at most ~SHARD_MB of text: per-shard work stays put
        row = {"mb": mb, "docs": docs, "shards": shards,
               **_run(corpus, os.path.join(work_dir, f"cache-{mb}mb"), shards)}
        rows.append(row)
        stages = ", ".join(f"{k} {v:,.0f}" for k, v in row["peak_rss_mb_by_stage"].items())
        print(f"data_scaling: {mb:,} MB ({docs:,} documents): {row['wall_s']:.0f} s, peak "
              f"{row['peak_rss_mb']:,.0f} MB resident (process tree; by stage: {stages})", flush=True)
    first, last = rows[0], rows[-1]
    return {"benchmark": "data_scaling", "sentences": len(sentences), "rows": rows,
            "s_per_mb": [round(r["wall_s"] / r["mb"], 2) for r in rows],
            "peak_ratio": round(last["peak_rss_mb"] / first["peak_rss_mb"], 2),
            "peak_within_bar": last["peak_rss_mb"] <= BAR_PEAK_RATIO * first["peak_rss_mb"]}


def _sentences() -> list[str]:
    """Every distinct sentence of 40-400 characters in the real pages here."""
    found: set[str] = set()
    for path in (PYPI, CC):
        if not os.path.exists(path):
            continue
        with gzip.open(path, "rt", encoding="utf-8") as f:
            for line in f:
                text = json.loads(line).get("text") or ""
                for s in re.split(r"(?<=[.!?])\s+|\n+", text):
                    s = s.strip()
                    if 40 <= len(s) <= 400:
                        found.add(s)
    if not found:
        raise RuntimeError(f"no real text to build a corpus from: {PYPI} is missing")
    return sorted(found)


def _write_corpus(directory: str, sentences: list[str], total: int, seed: int) -> int:
    """jsonl.gz files of unique documents (random sentence draws, paragraphs of 3-6 sentences) until
    `total` bytes of text; returns the number of documents."""
    os.makedirs(directory, exist_ok=True)
    rng, written, docs, part = random.Random(seed), 0, 0, 0
    while written < total:
        with gzip.open(os.path.join(directory, f"part-{part:05d}.jsonl.gz"), "wt", encoding="utf-8",
                       compresslevel=1) as f:
            in_file = 0
            while in_file < FILE_BYTES and written < total:
                target, paragraphs, size = rng.randint(2000, 6000), [], 0
                while size < target:
                    paragraph = " ".join(rng.choice(sentences) for _ in range(rng.randint(3, 6)))
                    paragraphs.append(paragraph)
                    size += len(paragraph) + 2
                text = "\n\n".join(paragraphs)
                f.write(json.dumps({"id": f"d{seed}-{docs}", "url": f"https://example.org/{seed}/{docs}",
                                    "text": text}) + "\n")
                written, in_file, docs = written + len(text), in_file + len(text), docs + 1
        part += 1
    return docs


def _run(corpus: str, cache: str, shards: int) -> dict:
    params = [*RUN, f"download.Files.paths = ['{corpus}/*.jsonl.gz']",
              f"download.Config.num_shards = {shards}", f"clean.Config.num_shards = {shards}",
              f"pipeline.Settings.cache_root = '{cache}'"]
    argv = [sys.executable, "-m", "pipeline", "run", "--stage", "shard"]
    argv += [a for path in GIN for a in ("--gin", path)] + [a for p in params for a in ("--gin-param", p)]
    start = time.time()
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    peak, out = _Peak(proc.pid), []
    for line in proc.stdout:            # "running clean (key ...)": which stage the memory is charged to
        out.append(line)
        if found := re.search(r"running (\w+) \(key", line):
            peak.stage = found.group(1)
    proc.wait()
    wall = time.time() - start
    peak.stop()
    if proc.returncode != 0:
        raise RuntimeError(f"data_scaling: the pipeline failed on {corpus}:\n{''.join(out)[-3000:]}")
    return {"wall_s": round(wall, 1), "peak_rss_mb": round(peak.bytes / 2**20, 1),
            "peak_processes": peak.processes,
            "peak_rss_mb_by_stage": {k: round(v / 2**20, 1) for k, v in peak.by_stage.items()}}


class _Peak:
    """The largest summed RSS of a process and its descendants, sampled every 0.2 s in a thread."""

    def __init__(self, pid: int):
        import psutil

        self.bytes, self.processes, self._done = 0, 0, threading.Event()
        self.stage, self.by_stage = "start", {}
        self._root = psutil.Process(pid)
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self):
        import psutil

        while not self._done.wait(0.2):
            try:
                tree = [self._root, *self._root.children(recursive=True)]
            except psutil.Error:
                return
            total = 0
            for p in tree:
                with contextlib.suppress(psutil.Error):       # gone between the listing and the look
                    total += p.memory_info().rss
            if total > self.bytes:
                self.bytes, self.processes = total, len(tree)
            self.by_stage[self.stage] = max(self.by_stage.get(self.stage, 0), total)

    def stop(self):
        self._done.set()
        self._thread.join()


def main(argv: list[str] | None = None) -> int:
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=",".join(map(str, SIZES_MB)), help="MB of text, comma-separated")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        result = measure(tmp, [int(x) for x in args.sizes.split(",")])
    os.makedirs(os.path.join(REPO, "benchmarks", "out"), exist_ok=True)
    with open(os.path.join(REPO, "benchmarks", "out", "data_scaling.json"), "w") as f:
        json.dump(result, f, indent=2)
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
