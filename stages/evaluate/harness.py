"""Any lm-evaluation-harness task against a trained Refinery model: an `lm_eval` `LM` over the native scorer.

    pip install -e '.[harness]'          # lm-eval without torch (`make test` installs it)
    python -m stages.evaluate.harness --train cache/train/<key> --tokenizer cache/tokenizer/<key> \\
        --shard cache/shard/<key> --tasks hellaswag,lambada_openai [--include-path my_tasks/] [--limit 100] \\
        [--num-fewshot 0] [--bare-contexts] [--max-length 2048] [--output results.json]

    from stages.evaluate import harness          # with a model already restored (`measure.restore`)
    lm = harness.RefineryLM(net, sp, eos_id)      # or RefineryLM.from_outputs(train, tokenizer, shard)
    results = harness.run_tasks(lm, ["hellaswag", "my_task"], include_path="my_tasks/", limit=100)

The prefix (`RefineryLM`'s prefix_id and prefix_contexts): by default every context and every rolling
document is scored after the EOS id, what training put before every document. lm-eval's own HF backend on
the exported model (whose tokenizer's bos_token is that EOS and adds it to every encoding) gives the same
log-likelihoods: multiple-choice and other loglikelihood tasks as they are, rolling (perplexity) tasks with
`add_bos_token=False` (else it scores the added token too). `--bare-contexts` (prefix_contexts=False)
reproduces lm-eval run with `add_bos_token=False` on every task (tests/export/test_lm_eval_hf.py).

A task is a name lm-eval knows, a name defined by a YAML file under `include_path`, or a path to a task YAML.
The directories are committed stage outputs: a key directory (holding `_SUCCESS.json`) or its attempt.

The three request types use the same code as the evaluate stage, so the numbers agree with it:
  loglikelihood           (context, continuation) -> `tokenized.request_ids` (the context after the prefix
                          token, the split lm-eval makes) and one packed `scoring.Scorer.loglikelihood` call,
                          cut as lm-eval's HF backend cuts at `max_length`.
  loglikelihood_rolling   (text,) -> `Scorer.loglikelihood_rolling_many`: every document's windows packed,
                          the first conditioned on the prefix token.
  generate_until          (context, gen_kwargs) -> the KV-cache sampler `measure._generate` (greedy unless
                          the task asks to sample), cut at the first EOS and then at the first `until` string;
                          at most `max_gen_toks` tokens, the context cut from the left to leave them room.

lm-eval is an optional extra: this module is the only one that imports it, and without it a user gets one
line saying how to install it.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import json
import logging
import os
import sys
from collections.abc import Sequence

INSTALL_HINT = ("lm-evaluation-harness is not installed; install Refinery's harness extra: "
                "pip install -e '.[harness]' (from the repository root)")

try:
    from lm_eval.api.model import LM
except ModuleNotFoundError as e:            # lm-eval itself missing, not one of its dependencies
    if (e.name or "").split(".")[0] != "lm_eval":
        raise
    if __name__ == "__main__":
        sys.exit(INSTALL_HINT)
    raise ModuleNotFoundError(INSTALL_HINT, name="lm_eval") from None

log = logging.getLogger(__name__)

DEFAULT_MAX_GEN_TOKS = 256                  # lm-eval's default when a task names none
GEN_KWARGS = ("until", "max_gen_toks", "do_sample", "temperature", "top_k")   # what generate_until honours


class RefineryLM(LM):
    """A restored model as an lm-eval `LM`.

    net: `model.Transformer` (`measure.restore`); sp: its `SentencePieceProcessor`; eos_id: the shard
    manifest's EOS id (where a generation stops). rows, length: the scorer's (rows, length) batch shape;
    length defaults to the model's max_seq_len (`from_outputs` uses training's seq_len, the positions the
    model learned); rolling windows are that long. max_length: lm-eval's, for loglikelihood requests (the
    last max_length + 1 tokens of context + continuation; a longer continuation is refused, as lm-eval's HF
    backend refuses it); None = length. The evaluate stage passes `evaluate.Config.max_length`, so that
    `lm_eval --model hf --model_args pretrained=<export>,max_length=<it>` gives its numbers. seed: for
    tasks that sample.

    What a request starts with (the setting lm-eval's HF backend must share to give the same numbers):
    prefix_id: the token every rolling document, and every context when `prefix_contexts`, is conditioned
    on; None = eos_id, what precedes every document in training (the one before it ends with EOS).
    prefix_contexts: True (the default, what training saw): a context is scored after prefix_id, as the
    evaluate stage scores its tasks; False: a context starts with its own first token, as lm-eval's HF
    backend does when the tokenizer adds nothing (`add_bos_token=False`). An empty context is always the
    prefix alone. The export's tokenizer and model card name this token (README "Use the model elsewhere").
    """

    def __init__(self, net, sp, eos_id: int, *, prefix_id: int | None = None, prefix_contexts: bool = True,
                 rows: int = 8, length: int | None = None, max_length: int | None = None, seed: int = 0):
        super().__init__()
        from stages.train import scoring

        self.net, self.sp, self.eos_id, self.seed = net, sp, int(eos_id), seed
        self.prefix_id = self.eos_id if prefix_id is None else int(prefix_id)
        self.prefix_contexts = bool(prefix_contexts)
        self.scorer = scoring.Scorer(net, prefix_id=self.prefix_id, rows=rows, length=length,
                                     max_length=max_length)
        self.length, self.max_length = self.scorer.length, self.scorer.max_length

    @classmethod
    def from_outputs(cls, train, tokenizer, shard, **options) -> RefineryLM:
        """From committed train, tokenizer and shard outputs (`Committed`s, or their directories)."""
        import sentencepiece as spm

        from stages.evaluate import measure
        from stages.io import storage

        train, tokenizer, shard = (committed(o, stage) if isinstance(o, str) else o for o, stage in
                                   ((train, "train"), (tokenizer, "tokenizer"), (shard, "shard")))
        summary = storage.read_json(train.file("summary.json"))
        net, _, _ = measure.restore(train, summary)
        sp = spm.SentencePieceProcessor(model_proto=storage.read_bytes(tokenizer.file("tokenizer.model")))
        eos_id = storage.read_json(shard.file("manifest.json"))["eos_id"]
        return cls(net, sp, eos_id, **{"length": summary["seq_len"], **options})

    def loglikelihood(self, requests) -> list[tuple[float, bool]]:
        """[Instance with args (context, continuation)] -> [(sum log-prob in nats, is greedy)]."""
        pairs = []
        for r in requests:
            context, continuation = r.args
            ctx_ids, cont_ids = self.request_ids(context, continuation)
            if not cont_ids:
                raise ValueError(f"{_where(r)}: continuation {continuation!r} encodes to no tokens after "
                                 f"context ...{context[-40:]!r}; lm-eval continuations are non-empty text")
            if len(cont_ids) > self.max_length:          # lm-eval's HF backend asserts the same
                raise ValueError(f"{_where(r)}: a continuation of {len(cont_ids)} tokens is longer than "
                                 f"max_length={self.max_length}; raise max_length (evaluate.Config."
                                 f"max_length, the harness CLI's --max-length) to at least {len(cont_ids)}")
            pairs.append((ctx_ids, cont_ids))
        out = self.scorer.loglikelihood(pairs)
        for r, result in zip(requests, out):
            self.cache_hook.add_partial("loglikelihood", r.args, result)
        return out

    def request_ids(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """(context ids, continuation ids) of one request under this LM's prefix setting: lm-eval's split
        (`tokenized.request_ids`), the context after prefix_id, or without it (`prefix_contexts=False`)
        unless the context is empty."""
        from stages.yardsticks.tokenized import request_ids

        ctx_ids, cont_ids = request_ids(self.sp, context, continuation, self.prefix_id)
        return (ctx_ids if self.prefix_contexts or len(ctx_ids) == 1 else ctx_ids[1:]), cont_ids

    def loglikelihood_rolling(self, requests) -> list[float]:
        """[Instance with args (text,)] -> [sum log-prob (nats) of the text's tokens, after prefix_id]."""
        docs = [self.sp.encode(r.args[0]) for r in requests]
        out = self.scorer.loglikelihood_rolling_many(docs)
        for r, result in zip(requests, out):
            self.cache_hook.add_partial("loglikelihood_rolling", r.args, result)
        return out

    def generate_until(self, requests) -> list[str]:
        """[Instance with args (context, gen_kwargs)] -> [continuation text, cut at EOS and `until`]."""
        out = []
        for i, r in enumerate(requests):
            context, gen_kwargs = r.args
            text = self.generate(context, **_generation_options(gen_kwargs, _where(r)), seed=self.seed + i)
            self.cache_hook.add_partial("generate_until", r.args, text)
            out.append(text)
        return out

    def generate(self, context: str, *, until: Sequence[str] = (), max_gen_toks: int = DEFAULT_MAX_GEN_TOKS,
                 temperature: float = 0.0, top_k: int = 0, seed: int = 0) -> str:
        """The continuation of `context` (after prefix_id, as the prefix setting says), up to the first EOS
        or `until` string, at most `max_gen_toks` tokens; temperature 0 is greedy. The context keeps its
        last tokens that leave room for the continuation within the scoring length."""
        from stages.evaluate import measure

        n = max(1, min(max_gen_toks, self.length - 1))
        head = [self.prefix_id] if self.prefix_contexts or not context else []
        whole = head + self.sp.encode(context)
        prompt = whole[-(self.length - n):]                                                 # (<= length - n,)
        shown = prompt[len(head):] if len(prompt) == len(whole) else prompt   # a long context loses its head
        ids = measure._generate(self.net, prompt, n, temperature=temperature, top_k=top_k, seed=seed)
        if self.eos_id in ids:
            ids = ids[:ids.index(self.eos_id)]
        text = continuation_text(self.sp, shown, ids)
        for stop in until:
            text = text.split(stop)[0]
        return text

    def get_model_info(self) -> dict:
        """What lm-eval records in results["config"]."""
        c = self.net.config
        return {"model": "refinery", "d_model": c.d_model, "n_layers": c.n_layers, "vocab_size": c.vocab_size,
                "length": self.length, "max_length": self.max_length}


def run_tasks(lm: LM, tasks: Sequence[str], *, limit: int | float | None = None,
              include_path: str | Sequence[str] | None = None, num_fewshot: int | None = None,
              log_samples: bool = False, bootstrap_iters: int = 100_000, seed: int = 0) -> dict:
    """lm-eval's results of `tasks` (names or task YAML paths) under `lm`, as plain JSON values:
    {"results": {task: {metric: value, ...}}, "n-samples": ..., "configs": ..., "versions": ...,
    "samples": {task: [...]} when log_samples}. limit: items per task (a fraction when < 1).
    include_path: directories of local task YAMLs; when every task is found there (or is a YAML path),
    lm-eval's own ~15k tasks are not indexed (that takes seconds)."""
    import lm_eval
    from lm_eval.utils import handle_non_serializable

    tasks = list(tasks)
    if not tasks:
        raise ValueError("run_tasks needs at least one task: an lm-eval task name, a task defined under "
                         "include_path, or a task YAML path")
    results = lm_eval.simple_evaluate(
        model=lm, tasks=tasks, task_manager=task_manager(tasks, include_path), limit=limit,
        num_fewshot=num_fewshot, log_samples=log_samples, bootstrap_iters=bootstrap_iters,
        random_seed=seed, numpy_random_seed=seed, torch_random_seed=None, fewshot_random_seed=seed)
    return json.loads(json.dumps(results, default=handle_non_serializable))


def task_manager(tasks: Sequence[str], include_path=None):
    """An lm-eval TaskManager that knows every one of `tasks`: only the local ones when that suffices.
    Raises ValueError naming the unknown tasks and the closest valid names."""
    from lm_eval.tasks import TaskManager

    def unknown(manager):
        return [t for t in tasks if t not in manager.all_tasks and not _is_yaml(t)]

    if include_path or all(_is_yaml(t) for t in tasks):
        local = TaskManager(include_path=include_path, include_defaults=False)
        if not unknown(local):
            return local
    manager = TaskManager(include_path=include_path)
    missing = unknown(manager)
    if missing:
        hints = {t: difflib.get_close_matches(t, manager.all_tasks, n=3) for t in missing}
        raise ValueError(f"unknown lm-eval task(s) {missing} (closest valid names: {hints}); valid: "
                         f"lm-eval's task names (`lm_eval ls tasks`), tasks defined by YAMLs under "
                         f"include_path={include_path!r}, or paths to task YAML files")
    return manager


def check_tasks(tasks: Sequence[str], include_path: str | None = None) -> str:
    """Why lm-eval cannot run `tasks`, in one line, or "": the evaluate stage's pre-run check, before any
    stage works. In order: a task YAML path that is no file; a task YAML (named, or any under include_path)
    that does not parse (its file and line: lm-eval itself skips such a file and then calls the task unknown);
    a name lm-eval does not know (with the closest names); a task whose data is a Hugging Face hub dataset
    that is in neither local cache while the hub cannot be reached (offline: HF_DATASETS_OFFLINE or
    HF_HUB_OFFLINE set, or no connection to the endpoint within HUB_PROBE_S). YAMLs are read as lm-eval
    reads them for its index, `!function` unresolved: no task Python runs here. Cost: importing lm-eval and
    datasets (~2 s of CPU); a name not found under include_path indexes lm-eval's ~15k built-in YAMLs (13 s
    on 2 busy cores); local names alone do not."""
    with _quiet(QUIET_LOGGERS):              # a pre-run problem is one line: no library chatter around it
        return _check_tasks(list(tasks), include_path)


# Loggers that talk at INFO/WARNING while lm-eval imports and indexes ("JAX version ... available", duplicate
# task names in lm-eval's own tree): kept to errors during the pre-run check.
QUIET_LOGGERS = ("datasets", "lm_eval", "lm-eval", "huggingface_hub", "evaluate")


@contextlib.contextmanager
def _quiet(names: Sequence[str]):
    loggers = [logging.getLogger(n) for n in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def _check_tasks(tasks: list[str], include_path: str | None) -> str:
    for t in tasks:
        if t.endswith((".yaml", ".yml")) and not os.path.isfile(t):
            return f"lm-eval task YAML {t!r} does not exist (a task is an lm-eval name or a YAML file's path)"
    yamls = [t for t in tasks if _is_yaml(t)] + (_yaml_files(include_path) if include_path else [])
    for path in yamls:
        if problem := yaml_problem(path):
            return problem
    try:
        manager = task_manager(tasks, include_path)
    except ValueError as e:
        return str(e)
    for name, dataset in _hub_datasets(manager, [t for t in tasks if not _is_yaml(t)]):
        if problem := hub_problem(name, dataset):
            return problem
    return ""


def yaml_problem(path: str) -> str:
    """Why lm-eval cannot read the task YAML `path` (or a file it includes), naming file and line, or ""."""
    import yaml
    from lm_eval.tasks._yaml_loader import load_yaml  # lm-eval's own reader (the version is pinned)

    try:
        load_yaml(path, resolve_func=False, recursive=True)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        where = f"{mark.name} line {mark.line + 1}" if mark is not None else path
        what = " ".join(str(getattr(e, "problem", None) or e).split())
        return f"lm-eval task YAML {where}: {what} (not valid YAML)"
    except (OSError, ValueError) as e:           # a missing include, an include cycle, not a mapping
        return f"lm-eval task YAML {path}: {e}"
    return ""


HUB_PROBE_S = 5.0          # how long the pre-run check waits to connect to the hub before calling it offline


def hub_problem(task: str, dataset: str) -> str:
    """Why lm-eval task `task` cannot get its hub dataset `dataset` (an "owner/name" or a name on the Hugging
    Face hub), or "": found in the datasets cache or the hub cache, or the hub can be reached."""
    import datasets.config
    import huggingface_hub.constants as hub

    cached = [os.path.join(datasets.config.HF_DATASETS_CACHE, dataset.replace("/", "___")),
              os.path.join(hub.HF_HUB_CACHE, "datasets--" + dataset.replace("/", "--"))]
    if any(os.path.isdir(p) for p in cached):
        return ""
    offline = [v for v in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE")
               if os.environ.get(v, "").upper() in ("1", "ON", "YES", "TRUE")]
    why = f"{'/'.join(offline)} is set" if offline else _unreachable(hub.ENDPOINT)
    if not why:
        return ""
    return (f"lm-eval task {task!r} reads the Hugging Face hub dataset {dataset!r}, which is in no local "
            f"cache ({cached[0]}, {cached[1]}) and cannot be downloaded: {why}; download it where the "
            "network is reachable (into the same HF_HOME), or choose a task whose data is local")


def _unreachable(endpoint: str) -> str:
    """"" when a TCP connection to the hub endpoint opens within HUB_PROBE_S, else why not."""
    import socket
    import urllib.parse

    url = urllib.parse.urlsplit(endpoint)
    try:
        socket.create_connection((url.hostname, url.port or 443), timeout=HUB_PROBE_S).close()
    except OSError as e:
        return f"no connection to {url.hostname} ({type(e).__name__}: {e})"
    return ""


def _hub_datasets(manager, names: Sequence[str]) -> list[tuple[str, str]]:
    """(task, hub dataset) of every task `names` run (a group's and a tag's members too) whose dataset_path
    is neither one of the `datasets` library's packaged readers (json, csv, parquet, ...) nor a local path.
    Python-class tasks name no dataset that can be read without running them: not listed."""
    from datasets.packaged_modules import _PACKAGED_DATASETS_MODULES
    from lm_eval.tasks._index import Kind

    found, seen, todo = [], set(), list(names)
    while todo:
        item = todo.pop()
        name = item.get("task", "") if isinstance(item, dict) else item        # a group's inline member
        entry = manager.task_index.get(name) if isinstance(name, str) else None
        if (entry is None and not isinstance(item, dict)) or name in seen:
            continue
        seen.add(name)
        kind = entry.kind if entry is not None else Kind.TASK
        cfg = {**((entry.cfg if entry is not None else None) or {}),
               **(item if isinstance(item, dict) else {})}
        if kind == Kind.GROUP:
            todo += list(cfg.get("task", []))
        elif kind == Kind.TAG:
            todo += sorted(entry.tags)
        elif kind == Kind.TASK:
            path = cfg.get("dataset_path", "")
            if path and path not in _PACKAGED_DATASETS_MODULES and not os.path.exists(path):
                found.append((name, path))
    return found


def _yaml_files(include_path: str) -> list[str]:
    """The task YAMLs lm-eval indexes under include_path (its rule: `**/*.yaml`), in a stable order."""
    import glob

    return sorted(glob.glob(os.path.join(include_path, "**", "*.yaml"), recursive=True))


def continuation_text(sp, prompt_ids: list[int], ids: list[int]) -> str:
    """The text `ids` add after `prompt_ids`, its leading space kept: decoded with the prompt and the
    prompt's text taken off (sentencepiece drops the leading space of a text decoded alone)."""
    before, whole = sp.decode(prompt_ids), sp.decode(prompt_ids + ids)
    return whole[len(before):] if whole.startswith(before) else sp.decode(ids)


def committed(path: str, stage: str):
    """A `Committed` for a stage output directory: a key directory (its `_SUCCESS.json` names the attempt
    and its files) or an attempt directory itself (its files as listed)."""
    from stages.io import storage
    from stages.io.committed import MANIFEST, Committed

    manifest_path = storage.join(path, MANIFEST)
    if storage.exists(manifest_path):
        manifest = storage.read_json(manifest_path)
        return Committed(stage, os.path.basename(path.rstrip("/")), storage.join(path, manifest["attempt"]),
                         manifest["files"], manifest)
    files = storage.sizes(path)
    if not files:
        raise FileNotFoundError(f"--{stage} {path}: no such directory, or it is empty; give the {stage} "
                                f"stage's committed output (cache/{stage}/<key>, `make status` lists them)")
    return Committed(stage, os.path.basename(path.rstrip("/")), path, files, {})


def _generation_options(gen_kwargs: dict, where: str) -> dict:
    """lm-eval's gen_kwargs -> `RefineryLM.generate`'s options, read as lm-eval's HF model reads them:
    sampling when do_sample is true, or when it is unset and temperature > 0."""
    gen_kwargs = dict(gen_kwargs or {})
    ignored = sorted(set(gen_kwargs) - set(GEN_KWARGS))
    if ignored:
        log.warning("%s: generation options %s are ignored; honoured: %s", where, ignored, list(GEN_KWARGS))
    until = gen_kwargs.get("until") or []
    until = [until] if isinstance(until, str) else list(until)
    temperature = float(gen_kwargs.get("temperature") or 0.0)
    do_sample = gen_kwargs.get("do_sample")
    sample = bool(do_sample) if do_sample is not None else temperature > 0
    return {"until": until, "max_gen_toks": int(gen_kwargs.get("max_gen_toks") or DEFAULT_MAX_GEN_TOKS),
            "temperature": (temperature or 1.0) if sample else 0.0,
            "top_k": int(gen_kwargs.get("top_k") or 0) if sample else 0}


def _where(request) -> str:
    return f"task {request.task_name!r} doc {request.doc_id}"


def _is_yaml(name: str) -> bool:
    return name.endswith((".yaml", ".yml")) and os.path.isfile(name)


def main(argv: Sequence[str] | None = None) -> int:
    from stages.yardsticks import MAX_LENGTH

    parser = argparse.ArgumentParser(prog="python -m stages.evaluate.harness",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--train", required=True, help="the train stage's committed output directory")
    parser.add_argument("--tokenizer", required=True, help="the tokenizer stage's committed output directory")
    parser.add_argument("--shard", required=True, help="the shard stage's committed output (its eos_id)")
    parser.add_argument("--tasks", required=True, help="comma-separated task names or task YAML paths")
    parser.add_argument("--include-path", action="append", help="a directory of task YAMLs (repeatable)")
    parser.add_argument("--limit", type=float, help="items per task (a fraction of each task when < 1)")
    parser.add_argument("--num-fewshot", type=int)
    parser.add_argument("--rows", type=int, default=8, help="rows per scoring batch")
    parser.add_argument("--max-length", type=int, default=MAX_LENGTH,
                        help="lm-eval's max_length for loglikelihood requests (the evaluate stage's "
                             f"evaluate.Config.max_length, default {MAX_LENGTH})")
    parser.add_argument("--bare-contexts", action="store_true",
                        help="contexts start with their own text, not after the EOS (lm-eval's HF backend "
                             "with add_bos_token=False)")
    parser.add_argument("--output", help="write the results JSON here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from lm_eval.utils import make_table

    lm = RefineryLM.from_outputs(args.train, args.tokenizer, args.shard, rows=args.rows,
                                 max_length=args.max_length, prefix_contexts=not args.bare_contexts)
    limit = None if args.limit is None else (int(args.limit) if args.limit >= 1 else args.limit)
    results = run_tasks(lm, [t for t in args.tasks.split(",") if t], limit=limit,
                        include_path=args.include_path, num_fewshot=args.num_fewshot)
    print(make_table(results))
    if args.output:
        with open(args.output, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
