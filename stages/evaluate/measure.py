"""The numbers behind eval.json: held-out loss, bits per byte, throughput, reference text in bits per byte
and downstream multiple-choice tasks (the yardsticks stage's, scored by `yardsticks/score.py`), and KV-cache
samples."""

from __future__ import annotations

import functools
import logging
import math
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from stages.io import llmc, storage
from stages.io.refusal import Refusal
from stages.train import data, scoring
from stages.train.model_config import ModelConfig
from stages.train.step import forward_loss
from stages.train.trained import restore
from stages.yardsticks import score, tokenized

log = logging.getLogger(__name__)

# The unigram baseline is estimated on the first 50M training tokens: exact for small corpora, and a
# real run's evaluation does not read the whole training set for one reference number.
UNIGRAM_TOKENS = 50_000_000


def evaluate(config, train, shards, tokenizer, yardsticks) -> dict:
    """eval.json's numbers for a trained model. `shards`: {"": shard} for a one-source run, or each source's
    shard stage; with several, each source's held-out figures go under "sources" and the top-level ones pool
    them (every source's evaluated tokens and bytes summed)."""
    import sentencepiece as spm

    found = tokenized.load(yardsticks)
    if problem := too_long(found.tasks, config.max_length):        # before any work: one line, no traceback
        raise Refusal(problem)
    manifest = storage.read_json(next(iter(shards.values())).file("manifest.json"))
    summary = storage.read_json(train.file("summary.json"))
    net, graphdef, params = restore(train, summary, moe_capacity_factor=config.moe_capacity_factor)
    sp = spm.SentencePieceProcessor(model_proto=storage.read_bytes(tokenizer.file("tokenizer.model")))
    seq_len = summary["seq_len"]
    options = {"eos_id": manifest["eos_id"], "loss_chunk": config.loss_chunk, "z_loss": 0.0}
    eval_fn = jax.jit(functools.partial(_batch_loss, graphdef, **options))
    per_source = {source: held_out(config, eval_fn, params, shard, sp, seq_len, UNIGRAM_TOKENS // len(shards))
                  for source, shard in shards.items()}
    parts = list(per_source.values())
    loss_sum, tokens = sum(p.pop("loss_sum") for p in parts), sum(p["tokens"] for p in parts)
    bits = sum(p["bits_per_byte"] * p["val_bytes"] for p in parts)
    val_bytes = sum(p["val_bytes"] for p in parts)
    unigram_tokens = np.concatenate([p.pop("unigram_sample") for p in parts])
    loss = loss_sum / max(tokens, 1)
    metrics = {
        "loss": loss,
        "perplexity": math.exp(min(loss, 50.0)),
        # one source: its own figure as computed (the pooled one equals it but for rounding)
        "bits_per_byte": parts[0]["bits_per_byte"] if len(parts) == 1 else bits / max(val_bytes, 1),
        "tokens": tokens,
        "tokens_per_s": tokens / max(sum(p.pop("seconds") for p in parts), 1e-9),
        "unigram_entropy": unigram_entropy(unigram_tokens, manifest["vocab_size"]),
        "val_bytes": val_bytes,
        "train_final_loss": summary.get("final_loss"),
    }
    if list(per_source) != [""]:
        metrics["sources"] = per_source
    metrics["scoring"] = scoring_setting(config, net.config, ModelConfig.from_json(summary["model"]))
    scorer = task_scorer(config, net, manifest["eos_id"], seq_len)
    start = time.perf_counter()
    metrics.update(score.score(scorer, found))
    # a wall time, logged rather than kept in eval.json: the output of a key holds no measurement it does
    # not need (tokens_per_s above is the evaluation's throughput, its one stated exception)
    log.info("yardsticks scored in %.1f s", time.perf_counter() - start)
    samples = [sample(net, sp, prompt, config) for prompt in config.prompts]
    # the model as the harness (`harness.RefineryLM`) takes it: (net, sp, eos_id, scoring length)
    return {"metrics": metrics, "samples": samples, "model": (net, sp, manifest["eos_id"], seq_len)}


def task_scorer(config, net, eos_id: int, seq_len: int) -> scoring.Scorer:
    """The packed scorer evaluation scores the yardsticks with: rows of training's seq_len (rolling windows
    that long), task requests cut by lm-eval's HF rule at `config.max_length`, after `eos_id`."""
    return scoring.Scorer(net, prefix_id=eos_id, rows=config.batch_size, length=seq_len,
                          max_length=config.max_length)


def scoring_setting(config, evaluated: ModelConfig, trained: ModelConfig) -> dict:
    """eval.json's "scoring": how the numbers were made. max_length: lm-eval's, which task requests were cut
    by (`lm_eval --model hf --model_args pretrained=<export>,max_length=<it>` gives the same numbers); for a
    mixture of experts, the capacity factor evaluation routed with (0: dropless, the exported model's) and
    the one training ran."""
    out = {"max_length": config.max_length}
    if evaluated.n_experts:
        out |= {"moe_capacity_factor": evaluated.moe_capacity_factor,
                "trained_moe_capacity_factor": trained.moe_capacity_factor}
    return out


def too_long(items_by_task: dict, max_length: int) -> str:
    """One line when a task answer is longer than max_length, which lm-eval's HF backend refuses (it
    asserts the continuation fits): scoring its head would give numbers lm-eval cannot reproduce. Or ""."""
    tokens, task, item = score.longest_continuation(items_by_task)
    if tokens <= max_length:
        return ""
    return (f"evaluate.Config.max_length={max_length}: {task} item {item} has an answer of {tokens} tokens, "
            f"longer than that (lm-eval's HF backend refuses it too): set evaluate.Config.max_length to at "
            f"least {tokens}, and lm-eval's max_length= model arg to the same")


def held_out(config, eval_fn, params, shard, sp, seq_len: int, unigram_tokens: int) -> dict:
    """One shard stage's validation split: loss (mean and summed), perplexity, bits per byte, tokens, bytes
    and seconds, and a sample of its first training tokens for the unigram baseline ("unigram_sample")."""
    manifest = storage.read_json(shard.file("manifest.json"))
    batches = config.max_eval_batches
    val_needed = batches * config.batch_size * seq_len + 1 if batches else None
    # Copied locally (when remote) only as far as they are read: the first unigram_tokens training tokens.
    with storage.local_files(leading_shards(shard, manifest, "val", val_needed)) as val_files, \
            storage.local_files(leading_shards(shard, manifest, "train", unigram_tokens)) as train_files:
        losses, tokens, start = [], 0, time.perf_counter()
        for i, batch in enumerate(data.eval_batches(val_files, manifest, seq_len=seq_len,
                                                    batch_size=config.batch_size)):
            if config.max_eval_batches and i >= config.max_eval_batches:
                break
            loss_sum, count = eval_fn(params, jnp.asarray(batch))
            losses.append(float(loss_sum))
            tokens += int(count)
        seconds = time.perf_counter() - start
        loss = sum(losses) / max(tokens, 1)
        # Bytes per token from the tokens the loss covered (the windows are read from the start, in order).
        val_tokens = _first_tokens(val_files, tokens + 1)
        val_bytes = _utf8_bytes(sp, val_tokens, manifest["eos_id"])
        unigram_sample = _first_tokens(train_files, unigram_tokens)
    return {"loss": loss, "perplexity": math.exp(min(loss, 50.0)),
            "bits_per_byte": loss / math.log(2) * len(val_tokens) / max(val_bytes, 1),
            "tokens": tokens, "val_bytes": val_bytes, "loss_sum": sum(losses), "seconds": seconds,
            "unigram_sample": unigram_sample}


def downstream_tasks(scorer, sp, items_by_task: dict, eos_id: int) -> dict:
    """`score.tasks` of text items {task: [tasks.Item]}, tokenized here with `sp` (the yardsticks stage
    tokenizes once per tokenizer; this is for a model and items at hand, as benchmarks and tests have)."""
    tokens = {name: tokenized.tokenize(items, sp, eos_id) for name, items in items_by_task.items()}
    return score.tasks(scorer, tokens)


def leading_shards(shard, manifest: dict, split: str, tokens: int | None) -> list[str]:
    """The paths of the first shards of `split` that hold at least `tokens` tokens (all when None), from
    the shard manifest's per-shard counts."""
    listed = manifest["splits"][split]["shards"]
    out, held = [], 0
    for entry in listed:
        if tokens is not None and held >= tokens:
            break
        out.append(shard.file(entry["file"]))
        held += entry["tokens"]
    return out


def _batch_loss(graphdef, params, batch, **options):
    """(summed loss, target count) of one (B, T + 1) batch."""
    out = forward_loss(graphdef, params, batch, **options)
    count = batch.shape[0] * (batch.shape[1] - 1)
    return out["loss"] * count, count


def unigram_entropy(tokens: np.ndarray, vocab_size: int) -> float:
    """Entropy (nats/token) of the tokens' unigram distribution: the loss of a model that predicts every
    token from its frequency alone."""
    counts = np.bincount(tokens, minlength=vocab_size)[:vocab_size]
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


def _first_tokens(files: list[str], n: int) -> np.ndarray:
    """The first n tokens of the stream the shards form (memory-mapped: only those pages are read)."""
    pieces, left = [], n
    for f in files:
        if left <= 0:
            break
        pieces.append(np.asarray(llmc.read(f, mmap=True)[:left]))
        left -= len(pieces[-1])
    return np.concatenate(pieces) if pieces else np.zeros(0, np.int32)


def _utf8_bytes(sp, tokens: np.ndarray, eos_id: int) -> int:
    """Bytes of text the tokens stand for: decode document by document (split at EOS)."""
    cuts = np.flatnonzero(tokens == eos_id)
    total, begin = 0, 0
    for end in list(cuts) + [len(tokens)]:
        doc = tokens[begin:end].tolist()
        if doc:
            total += len(sp.decode(doc).encode("utf-8"))
        begin = end + 1
    return total


def sample(net, sp, prompt: str, config) -> dict:
    """A greedy and a temperature continuation of `prompt`, decoded one token at a time with a KV cache.

    "greedy" and "sampled" are whole texts, prompt included: the prompt's and the continuation's tokens are
    decoded together. Sentencepiece writes the space before a word into that word's first piece
    ("▁current") and decoding drops a text's leading space, so a continuation decoded on its own loses the
    space after the prompt ("Return thecurrent ...").
    """
    ids = sp.encode(prompt)
    greedy = _generate(net, ids, config.max_new_tokens, temperature=0.0, top_k=0, seed=config.seed)
    sampled = _generate(net, ids, config.max_new_tokens, temperature=config.temperature, top_k=config.top_k,
                        seed=config.seed)
    return {"prompt": prompt, "greedy": sp.decode(ids + greedy), "sampled": sp.decode(ids + sampled),
            "temperature": config.temperature}


def _generate(net, prompt_ids: list[int], n: int, *, temperature: float, top_k: int, seed: int) -> list[int]:
    max_len = min(len(prompt_ids) + n, net.config.max_seq_len)
    prompt_ids = prompt_ids[-(max_len - 1):] or [0]
    graphdef, state = nnx.split(net)
    step = functools.partial(_decoder(graphdef), state)
    cache = net.init_cache(1, max_len)
    positions = jnp.arange(len(prompt_ids), dtype=jnp.int32)[None]              # (1, P)
    logits, cache = step(jnp.asarray([prompt_ids], jnp.int32), positions, cache)  # prefill: (V,)
    key = jax.random.PRNGKey(seed)
    out = []
    for i in range(max_len - len(prompt_ids)):
        key, sub = jax.random.split(key)
        token = int(_pick(logits, sub, temperature, top_k))
        out.append(token)
        if i + 1 == max_len - len(prompt_ids):
            break
        pos = jnp.asarray([[len(prompt_ids) + i]], jnp.int32)
        logits, cache = step(jnp.asarray([[token]], jnp.int32), pos, cache)
    return out


@functools.lru_cache(maxsize=4)
def _decoder(graphdef):
    """A jitted (state, tokens (1, t), positions (1, t), cache) -> (last logits (V,), cache) of one model
    structure (a hashable `nnx.GraphDef`): one compile for the prefill of each prompt length and one for all
    single-token steps (eager NNX would re-dispatch every op of every layer per token). The weights are an
    argument, never constants of the program, so every model of one shape runs the same executables (and
    XLA's compilation cache serves the next model's evaluation)."""

    @jax.jit
    def step(state, tokens, positions, cache):
        m = nnx.merge(graphdef, state)
        hidden, cache = m(tokens, positions=positions, cache=cache)
        return m.logits(hidden[:, -1:])[0, -1], cache

    return step


def _pick(logits, key, temperature: float, top_k: int):
    if temperature == 0.0:
        return jnp.argmax(logits)
    logits = logits / temperature
    if top_k:
        kth = jnp.sort(logits)[-top_k]
        logits = jnp.where(logits < kth, -jnp.inf, logits)
    return jax.random.categorical(key, logits)
