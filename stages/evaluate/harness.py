"""Any lm-evaluation-harness task against a trained Refinery model: an `lm_eval` `LM` over the native scorer.

    pip install -e '.[harness]'          # lm-eval without torch (`make test` installs it)
    python -m stages.evaluate.harness --train cache/train/<key> --tokenizer cache/tokenizer/<key> \\
        --shard cache/shard/<key> --tasks hellaswag,lambada_openai [--include-path my_tasks/] [--limit 100] \\
        [--num-fewshot 0] [--output results.json]

    from stages.evaluate import harness          # with a model already restored (`measure.restore`)
    lm = harness.RefineryLM(net, sp, eos_id)      # or RefineryLM.from_outputs(train, tokenizer, shard)
    results = harness.run_tasks(lm, ["hellaswag", "my_task"], include_path="my_tasks/", limit=100)

A task is a name lm-eval knows, a name defined by a YAML file under `include_path`, or a path to a task YAML.
The directories are committed stage outputs: a key directory (holding `_SUCCESS.json`) or its attempt.

The three request types use the same code as the evaluate stage, so the numbers agree with it:
  loglikelihood           (context, continuation) -> `tokenized.request_ids` (the context after an EOS, the
                          split lm-eval makes) and one packed `scoring.Scorer.loglikelihood` call for all.
  loglikelihood_rolling   (text,) -> `Scorer.loglikelihood_rolling_many`: every document's windows packed.
  generate_until          (context, gen_kwargs) -> the KV-cache sampler `measure._generate` (greedy unless
                          the task asks to sample), cut at the first EOS and then at the first `until` string;
                          at most `max_gen_toks` tokens, the context cut from the left to leave them room.

lm-eval is an optional extra: this module is the only one that imports it, and without it a user gets one
line saying how to install it.
"""

from __future__ import annotations

import argparse
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
    manifest's EOS id (what precedes every training document, so every request's context starts after it).
    rows, length: the scorer's (rows, length) batch shape; length defaults to the model's max_seq_len
    (`from_outputs` uses training's seq_len, the positions the model learned). seed: for tasks that sample.
    """

    def __init__(self, net, sp, eos_id: int, *, rows: int = 8, length: int | None = None, seed: int = 0):
        super().__init__()
        from stages.train import scoring

        self.net, self.sp, self.eos_id, self.seed = net, sp, int(eos_id), seed
        self.scorer = scoring.Scorer(net, prefix_id=self.eos_id, rows=rows, length=length)
        self.length = self.scorer.length

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
        from stages.yardsticks.tokenized import request_ids

        pairs, cut = [], 0
        for r in requests:
            context, continuation = r.args
            ctx_ids, cont_ids = request_ids(self.sp, context, continuation, self.eos_id)
            if not cont_ids:
                raise ValueError(f"{_where(r)}: continuation {continuation!r} encodes to no tokens after "
                                 f"context ...{context[-40:]!r}; lm-eval continuations are non-empty text")
            if len(cont_ids) > self.length:     # longer than the model sees: its head, as evaluate does
                cont_ids, cut = cont_ids[:self.length], cut + 1
            pairs.append((ctx_ids, cont_ids))
        if cut:
            log.warning("%d continuations longer than %d tokens were scored on their first %d", cut,
                        self.length, self.length)
        out = self.scorer.loglikelihood(pairs)
        for r, result in zip(requests, out):
            self.cache_hook.add_partial("loglikelihood", r.args, result)
        return out

    def loglikelihood_rolling(self, requests) -> list[float]:
        """[Instance with args (text,)] -> [sum log-prob (nats) of every token of the text, after an EOS]."""
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
        """The continuation of `context` (after an EOS), up to the first EOS or `until` string, at most
        `max_gen_toks` tokens; temperature 0 is greedy. The context keeps its last tokens that leave room
        for the continuation within the scoring length."""
        from stages.evaluate import measure

        n = max(1, min(max_gen_toks, self.length - 1))
        prompt = ([self.eos_id] + self.sp.encode(context))[-(self.length - n):]          # (<= length - n,)
        ids = measure._generate(self.net, prompt, n, temperature=temperature, top_k=top_k, seed=seed)
        if self.eos_id in ids:
            ids = ids[:ids.index(self.eos_id)]
        text = continuation_text(self.sp, [t for t in prompt if t != self.eos_id], ids)
        for stop in until:
            text = text.split(stop)[0]
        return text

    def get_model_info(self) -> dict:
        """What lm-eval records in results["config"]."""
        c = self.net.config
        return {"model": "refinery", "d_model": c.d_model, "n_layers": c.n_layers, "vocab_size": c.vocab_size,
                "length": self.length}


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


def continuation_text(sp, prompt_ids: list[int], ids: list[int]) -> str:
    """The text `ids` add after `prompt_ids`, its leading space kept: decoded with the prompt and the
    prompt's text taken off (sentencepiece drops the leading space of a text decoded alone)."""
    before, whole = sp.decode(prompt_ids), sp.decode(prompt_ids + ids)
    return whole[len(before):] if whole.startswith(before) else sp.decode(ids)


def committed(path: str, stage: str):
    """A `Committed` for a stage output directory: a key directory (its `_SUCCESS.json` names the attempt
    and its files) or an attempt directory itself (its files as listed)."""
    from stages.io import storage
    from stages.io.committed import Committed

    manifest_path = storage.join(path, "_SUCCESS.json")
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
    parser.add_argument("--output", help="write the results JSON here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from lm_eval.utils import make_table

    lm = RefineryLM.from_outputs(args.train, args.tokenizer, args.shard, rows=args.rows)
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
