"""The export stage: the trained model as a Hugging Face directory that transformers loads as it is.

    make export                                   (make pipeline runs it too: the DAG's last stage)
    make stage STAGE=export OVERRIDES='export.Config.dtype="bfloat16"'

    from transformers import AutoModelForCausalLM, AutoTokenizer
    model = AutoModelForCausalLM.from_pretrained("cache/export/<key>/<attempt>")    # the path `make pipeline`
    tokenizer = AutoTokenizer.from_pretrained("cache/export/<key>/<attempt>")      # prints on its last lines

Writes into `out_dir`:
    config.json                 LlamaForCausalLM, or for a mixture of experts MixtralForCausalLM or
                                Glm4MoeForCausalLM, or with multi-head latent attention DeepseekV3ForCausalLM
                                (stages/train/hf.py: GQA or MLA, RoPE and its scaling in the form
                                transformers 5 reads and the one 4.x reads, tied embeddings, rms_norm_eps;
                                the experts one tensor each, the layout vLLM and llama.cpp read)
    generation_config.json      bos/eos ids, greedy by default
    model.safetensors           or model-0000i-of-0000n.safetensors + model.safetensors.index.json above
                                `max_shard_bytes`; written tensor by tensor from train's Orbax checkpoint (one
                                layer's slice read at a time: no host ever holds the model)
    tokenizer.model             the tokenizer stage's sentencepiece model
    tokenizer.json              the same tokenizer for transformers' fast tokenizers (identical ids:
                                tokenizer_json.py), tokenizer_config.json, special_tokens_map.json
    README.md                   the model card: every stage's key and figures, the evaluation, the gin
                                config that made it, what a context starts with (card.py); a function of
                                the key: no timing, no machine path

What a context starts with: training put EOS before every document (the previous one's end; with the shard's
add_bos, BOS right before the text), so the model predicts a text's first token after that token. The export
calls it the tokenizer's bos_token (config.json's and generation_config.json's bos_token_id, GPT-2's
convention when it is the EOS) and the tokenizer adds it to every encoding (`add_bos_token`): transformers'
`tokenizer(text)` and lm-eval's HF backend then condition on what training did, as Refinery's own scorer
does (`harness.RefineryLM`, tests/export/test_lm_eval_hf.py).

A model none of those classes can express (`hf.problem` names the setting: a softmax router with groups, a
sigmoid one without shared experts, ...) is refused before any stage runs when the run includes the export
(`check_upstream`; `make plan` prints the same line), so only `--stage train` or `--stage evaluate` trains
one. Should one reach the stage anyway (a bias that init_from set away from zero), it is not converted: the
stage writes the model card and NOT_EXPORTED.md saying why, and its summary line says so, so the DAG still
ends (its weights stay in train's Orbax checkpoint). A tokenizer setting the
fast tokenizer cannot express fails the stage with one line naming it, before anything is written.
No JAX: the checkpoint is read with TensorStore (stages/train/checkpoint_arrays.py), so exporting the tiny
model takes 0.2 s.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping

from stages.io import storage
from stages.io.committed import by_source

log = logging.getLogger(__name__)

DTYPES = ("", "float32", "bfloat16", "float16")
GIGABYTE = 1_000_000_000
NOT_EXPORTED = "NOT_EXPORTED.md"          # written instead of the weights when transformers cannot load them


@dataclasses.dataclass(frozen=True)
class Config:
    dtype: str = ""                          # the weights' dtype in the files; "": train's param_dtype
    max_shard_bytes: int = 5 * GIGABYTE      # safetensors files at most this large (save_pretrained's 5GB)
    name: str = ""                           # the model card's title; "": refinery-<train key[:12]>

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ValueError(f"export.Config.dtype={self.dtype!r} is not one of {DTYPES} ('' = the training "
                             "param_dtype)")
        if self.max_shard_bytes < 1:
            raise ValueError(f"export.Config.max_shard_bytes={self.max_shard_bytes} must be >= 1")


CONFIGURABLES = (Config,)
# 2: the card is a function of the key (no tokens/s, no report or checkpoint path) and says what a context
#    starts with; the tokenizer adds that token (bos_token = training's document prefix: EOS, or BOS with
#    add_bos).
# 3: the card's lm-eval command carries the evaluation's max_length (eval.json's scoring), and a mixture of
#    experts' evaluation says whether it scored the dropless model.
# 4: the card's table names every stage the model was made from (the manifests' upstream keys followed through
#    the cache: download, score, each source's, the reference model's run), not the inputs' upstream only.
VERSION = "4"


def run(config: Config, inputs: Mapping, out_dir: str, work_dir: str) -> None:
    import numpy as np

    from stages.export import card, tokenizer_json
    from stages.io import safetensors
    from stages.train import hf
    from stages.train.checkpoint_arrays import CheckpointArrays
    from stages.train.model_config import ModelConfig

    train, tok = inputs["train"], inputs["tokenizer"]
    summary = storage.read_json(train.file("summary.json"))
    mcfg = ModelConfig.from_json(summary["model"])
    title = config.name or f"refinery-{train.key[:12]}"
    problem = hf.problem(mcfg)
    arrays = None if problem else CheckpointArrays(storage.join(train.path, "checkpoint"))
    if why := problem or implied_zero_problem(arrays, mcfg):
        log.warning("export: not exported: %s", why)
        # The key, not the path: the same bytes on every machine (`<cache_root>/train/<key>/` finds it).
        storage.write_text(storage.join(out_dir, NOT_EXPORTED), f"# Not exported\n\n{why}.\n\nThe weights "
                           f"are in the training stage's Orbax checkpoint: train/{train.key}/ (checkpoint/) "
                           "under the cache root\n")
        storage.write_text(storage.join(out_dir, "README.md"), card.model_card(title, inputs, mcfg))
        return
    sp_bytes = storage.read_bytes(tok.file("tokenizer.model"))
    sp = tokenizer_json.read_model(sp_bytes)
    if why := tokenizer_json.problem(sp):
        raise ValueError(f"export: tokenizer {tok.file('tokenizer.model')}: {why}")
    # a mixture's sources share one tokenizer and its special ids (training checked): any one's manifest
    shard = storage.read_json(next(iter(by_source(inputs, "shard").values())).file("manifest.json"))
    dtype = config.dtype or mcfg.param_dtype

    tensors = {t.name: t for t in hf.tensors(mcfg)}
    last_of_layer = {t.layer: name for name, t in tensors.items() if t.layer is not None}   # for progress
    check_shapes(arrays, mcfg)
    specs = [safetensors.Spec(t.name, t.shape, t.dtype or dtype) for t in tensors.values()]
    files = safetensors.plan_shards(specs, config.max_shard_bytes)
    names = safetensors.shard_names(len(files))
    total = sum(s.nbytes for s in specs)
    log.info("export: %s, %d tensors, %.2f GB (%s) into %d safetensors file(s) in %s", hf.architecture(mcfg),
             len(specs), total / GIGABYTE, dtype, len(files), out_dir)
    for note in hf.notes(mcfg):
        log.info("export: %s", note)
    done = 0

    def array_for(spec):
        nonlocal done
        t = tensors[spec.name]
        # (a transposed view of the stored layer) -> one C-ordered copy in the file's dtype, written as it is
        out = np.ascontiguousarray(t.to_hf(arrays.read(t.param, t.index)),
                                   dtype=safetensors.numpy_dtype(spec.dtype))
        done += spec.nbytes
        if t.layer is not None and last_of_layer[t.layer] == spec.name:
            log.info("export: layer %d of %d written (%.0f%% of %.2f GB)", t.layer + 1, mcfg.n_layers,
                     100 * done / total, total / GIGABYTE)
        return out

    metadata = {"format": "pt", "source": f"refinery train {train.key}"}
    for name, group in zip(names, files):
        safetensors.write(storage.join(out_dir, name), group, array_for, metadata)
    if len(files) > 1:
        storage.write_json(storage.join(out_dir, safetensors.INDEX), safetensors.index(files))

    start_id, eos_id = document_start(shard), shard["eos_id"]
    storage.write_json(storage.join(out_dir, "config.json"),
                       hf.config_json(mcfg, bos_id=start_id, eos_id=eos_id, dtype=dtype))
    storage.write_json(storage.join(out_dir, "generation_config.json"),
                       {"bos_token_id": start_id, "eos_token_id": eos_id, "do_sample": False})
    storage.write_bytes(storage.join(out_dir, "tokenizer.model"), sp_bytes)
    storage.write_json(storage.join(out_dir, "tokenizer.json"),
                       tokenizer_json.tokenizer_json(sp, bos_id=start_id))
    start = sp.pieces[start_id][0]
    specials = {"bos_token": start, "eos_token": sp.pieces[eos_id][0],
                "unk_token": sp.pieces[sp.id_of(tokenizer_json.UNKNOWN)][0]}
    storage.write_json(storage.join(out_dir, "special_tokens_map.json"), specials)
    storage.write_json(storage.join(out_dir, "tokenizer_config.json"), specials | {
        # PreTrainedTokenizerFast reads tokenizer.json as it is (a model-specific class may rebuild parts)
        "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": mcfg.max_seq_len,
        "add_bos_token": True, "add_eos_token": False, "padding_side": "left",
        "clean_up_tokenization_spaces": False})
    storage.write_text(storage.join(out_dir, "README.md"),
                       card.model_card(title, inputs, mcfg, (start, start_id)))
    log.info("export: done")


def check_upstream(config: Config, upstream: dict) -> str:
    """The pre-run check (pipeline/checks.py) and what `make plan` prints: the planned training config's
    model as one line when no transformers class can hold it (`hf.problem`), or "". Without it an MoE of
    that shape trains to the end and only then is NOT_EXPORTED.md; `--stage train` (or evaluate) still
    trains it."""
    from stages.train import hf

    if why := hf.problem(upstream["train"].model):
        return (f"the trained model cannot be exported to transformers: {why}; or train and evaluate it "
                "without the export: --stage evaluate (make stage STAGE=evaluate)")
    return ""


def document_start(shard_manifest: dict) -> int:
    """The token training put right before every document's text: BOS with the shard's add_bos, else the EOS
    that ends the document before it. The export's bos_token: what every context must start with."""
    return shard_manifest["bos_id"] if shard_manifest.get("add_bos") else shard_manifest["eos_id"]


def implied_zero_problem(arrays, mcfg) -> str:
    """A parameter the exported class fixes at zero (Mixtral's selection bias) that the checkpoint holds
    otherwise, in one line, or "": a bias set away from zero (by init_from, say) would route differently."""
    import numpy as np

    from stages.train import hf

    for name in sorted(hf.implied_zero(mcfg)):
        values = np.asarray(arrays.read(name))
        if np.any(values != 0):
            return (f"{name} holds non-zero values (largest {np.abs(values).max():.3g}): transformers' "
                    f"{hf.architecture(mcfg)} has no selection bias")
    return ""


def check_shapes(arrays, mcfg) -> None:
    """Every parameter the config implies is in the checkpoint with the shape the config implies."""
    from stages.train.model_config import param_layout

    stored = arrays.names()
    for name, (shape, _) in param_layout(mcfg).items():
        if name not in stored:
            raise ValueError(f"export: checkpoint {arrays.path} has no parameter {name!r} (it has "
                             f"{stored}); was it written by this training config?")
        if arrays.shape(name) != tuple(shape):
            raise ValueError(f"export: checkpoint {arrays.path}: {name} is {arrays.shape(name)}, the model "
                             f"config says {tuple(shape)}")


def summary(out) -> str:
    """One line for the run summary, from a committed export (a `stages.io.committed.Committed`)."""
    if NOT_EXPORTED in out.files:
        why = storage.read_text(out.file(NOT_EXPORTED)).split("\n\n")[1].rstrip(".")
        return f"not exported ({why}); model card {out.file('README.md')}"
    c = storage.read_json(out.file("config.json"))
    weights = sum(size for name, size in out.files.items() if name.endswith(".safetensors"))
    n_files = sum(name.endswith(".safetensors") for name in out.files)
    return (f"{c['architectures'][0]} ({c['dtype']}, {weights / 1e6:,.1f} MB in {n_files} safetensors "
            f"file(s)): AutoModelForCausalLM.from_pretrained({out.path!r})")
