"""A mixture of experts exported as transformers' MixtralForCausalLM (softmax routing) or Glm4MoeForCausalLM
(DeepSeek-V3's sigmoid routing with its bias, groups, shared experts and leading dense layers), judged by
transformers' own modeling code: next-token logits on a 600-token prompt in float32 within 1e-4 of the JAX
model's, greedy generation token for token, the per-expert layout vLLM and llama.cpp read, and a round
trip through init_from that gives back every tensor; settings neither class can express fail in one line."""

import dataclasses
import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from flax import nnx  # noqa: E402

from stages.io import safetensors  # noqa: E402
from stages.train import hf, model  # noqa: E402
from stages.train.model_config import ModelConfig  # noqa: E402
from tests.export import helpers  # noqa: E402

PROMPT = 600
BASE = ModelConfig(vocab_size=320, d_model=64, n_layers=3, n_heads=4, n_kv_heads=2, head_dim=32, mlp_dim=128,
                   max_seq_len=1024, dtype="float32", init_std=0.1, n_experts=8, n_experts_per_token=2,
                   moe_mlp_dim=48)
MIXTRAL = dataclasses.replace(BASE, router_score="softmax", router_norm_topk=True)
# gin/model/600b.gin's routing, tiny: sigmoid scores, selection bias, top-2 from the best 2 of 4 groups,
# renormalised then scaled 2.5, one shared expert, a dense first layer; tied embeddings and YaRN besides
GLM = dataclasses.replace(BASE, router_score="sigmoid", router_norm_topk=True, router_scale=2.5,
                          router_groups=4, router_topk_groups=2, n_shared_experts=1, n_dense_layers=1,
                          moe_bias_update_rate=1e-3, moe_capacity_factor=1.25, tie_embeddings=True,
                          rope_scaling="yarn", rope_factor=4.0, rope_original_max_len=256)
VARIANTS = {"mixtral": (MIXTRAL, hf.MIXTRAL), "glm4_moe": (GLM, hf.GLM4_MOE),
            "glm4_moe_no_norm": (dataclasses.replace(GLM, router_norm_topk=False, n_shared_experts=2,
                                                     n_dense_layers=0, router_scale=1.0), hf.GLM4_MOE)}


@pytest.fixture(scope="module")
def sp_model():
    return helpers.tokenizer_model()


def _jax_model(cfg, seed=0):
    """A random model; a sigmoid router's selection bias set away from zero, so that it must be exported."""
    net = model.Transformer(cfg, rngs=nnx.Rngs(seed))
    params = nnx.split(net, nnx.Param)[1]
    if cfg.router_score == "sigmoid":
        bias = params["moe_layers"]["router_bias"]
        bias[...] = 0.3 * jax.random.normal(jax.random.key(seed + 7), bias[...].shape)
        net = nnx.merge(nnx.graphdef(net), params)
    return net, params


def _dropless(cfg):
    """What transformers computes: every assignment (a capacity factor is a training setting, hf.notes)."""
    return dataclasses.replace(cfg, moe_capacity_factor=0.0)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_logits_match_transformers_on_a_long_prompt(tmp_path, sp_model, name):
    cfg, arch = VARIANTS[name]
    net, params = _jax_model(_dropless(cfg))
    out = helpers.export_model(tmp_path, cfg, params, sp_model)
    theirs_model = helpers.transformers_logits_match(net, out, cfg.vocab_size, PROMPT, name)
    assert type(theirs_model).__name__ == arch


@pytest.mark.parametrize("name", ["mixtral", "glm4_moe"])
def test_greedy_generation_matches_token_for_token(tmp_path, sp_model, name):
    # untied: a random tied model repeats the token it was given, which any model would match
    cfg = dataclasses.replace(VARIANTS[name][0], tie_embeddings=False)
    net, params = _jax_model(_dropless(cfg), seed=3)
    ours, theirs = helpers.greedy_both(net, helpers.export_model(tmp_path, cfg, params, sp_model))
    assert len(set(ours)) > 1                      # not a constant sequence that any model could match
    assert ours == theirs


@pytest.mark.parametrize("name", ["mixtral", "glm4_moe"])
def test_per_expert_files_round_trip_through_init_from_to_identical_tensors(tmp_path, sp_model, name):
    """The files hold one tensor an expert (what vLLM and llama.cpp read); init_from reads them back into
    the same parameters, and exporting those again writes the same bytes."""
    cfg, _ = VARIANTS[name]
    _, params = _jax_model(cfg)
    first = helpers.export_model(tmp_path / "a", cfg, params, sp_model)
    with safetensors.Reader(str(first / "model.safetensors")) as f:
        names = f.names()
        expert = ("block_sparse_moe.experts.7.w2.weight" if name == "mixtral" else
                  "mlp.experts.7.down_proj.weight")
        assert f"model.layers.2.{expert}" in names and not any("gate_up_proj" in n for n in names)
        if name == "glm4_moe":
            assert f.array("model.layers.1.mlp.gate.e_score_correction_bias").dtype == np.float32
    helpers.reexports_identically(first, cfg, params, sp_model, hf.MOE_EXPRESSED)


def test_the_config_says_every_rotary_dimension_and_the_capacity_is_in_the_card(tmp_path, sp_model):
    _, params = _jax_model(GLM)
    out = helpers.export_model(tmp_path, GLM, params, sp_model)
    config = json.loads((out / "config.json").read_text())
    assert config["partial_rotary_factor"] == config["rope_parameters"]["partial_rotary_factor"] == 1.0
    assert config["rope_scaling"]["partial_rotary_factor"] == 1.0 and config["num_nextn_predict_layers"] == 0
    assert (config["n_group"], config["topk_group"], config["routed_scaling_factor"]) == (4, 2, 2.5)
    card = (out / "README.md").read_text()
    assert "Glm4MoeForCausalLM" in card and "capacity factor of 1.25" in card


@pytest.mark.parametrize("change, message", [
    ({"router_score": "softmax", "router_norm_topk": False},
     r"router_norm_topk=False: transformers' MixtralForCausalLM \(softmax routing\) renormalises"),
    ({"router_score": "softmax", "router_norm_topk": True, "router_groups": 2, "router_topk_groups": 1,
      "n_shared_experts": 0, "n_dense_layers": 0, "router_scale": 1.0, "moe_bias_update_rate": 0.0},
     r"router_groups=2: transformers' MixtralForCausalLM \(softmax routing\) routes over every expert"),
    ({"n_shared_experts": 0}, r"n_shared_experts=0: transformers' Glm4MoeForCausalLM \(sigmoid routing\) "),
    ({"router_groups": 8, "router_topk_groups": 2, "n_experts_per_token": 2},
     r"router_groups=8: groups of one expert"),
])
def test_what_neither_class_can_express_is_not_exported_and_says_why(tmp_path, sp_model, change, message):
    cfg = dataclasses.replace(GLM, **change)
    assert re.search(message, hf.problem(cfg)), hf.problem(cfg)
    # refused before any stage runs (pipeline/checks.py), the same line as NOT_EXPORTED.md's below
    assert re.search(message, _refused_before_work(cfg)), _refused_before_work(cfg)
    _, params = _jax_model(cfg)
    out = helpers.export_model(tmp_path, cfg, params, sp_model)
    assert not (out / "model.safetensors").exists()
    assert re.search(message, (out / "NOT_EXPORTED.md").read_text())


def _refused_before_work(cfg: ModelConfig) -> str:
    """What the export stage's pre-run check says of a run training `cfg` ("" when it may run)."""
    from stages import export, train

    return export.check_upstream(export.Config(), {"train": train.Config(model=cfg)})


@pytest.mark.parametrize("name", list(VARIANTS))
def test_what_a_class_holds_is_not_refused_before_work(name):
    assert _refused_before_work(VARIANTS[name][0]) == ""


def test_evaluation_scores_the_dropless_model_the_export_is(tmp_path, sp_model):
    """The GLM twin trained with a capacity factor of 1.25, evaluated as the evaluate stage evaluates it
    (`measure.restore` at `evaluate.Config`'s default capacity, the packed scorer, `score.logliks` on task
    items): its logits and every answer's log-likelihood equal transformers' on the export. Restored at
    training's capacity the same scores differ, so the equality says which forward pass evaluation ran."""
    from stages import evaluate
    from stages.evaluate import measure
    from stages.yardsticks import score, tokenized

    _, params = _jax_model(GLM)
    out = helpers.export_model(tmp_path, GLM, params, sp_model)
    train, summary = helpers.committed("train", tmp_path / "train"), {"model": dataclasses.asdict(GLM)}
    net, _, _ = measure.restore(train, summary, moe_capacity_factor=evaluate.Config().moe_capacity_factor)
    dropping, _, _ = measure.restore(train, summary, moe_capacity_factor=None)       # training's 1.25
    assert (net.config.moe_capacity_factor, dropping.config.moe_capacity_factor) == (0.0, 1.25)
    theirs_model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()

    rng = np.random.default_rng(6)
    items = [tokenized.Item(f"t-{i}", 0, (1, 1, 1), tuple(
        ((2, *rng.integers(3, 300, int(rng.integers(8, 120)))), tuple(rng.integers(3, 300, int(n))))
        for n in rng.integers(2, 40, 3))) for i in range(12)]
    requests = [(list(ctx), list(cont)) for item in items for ctx, cont in item.requests]
    with torch.no_grad():
        want = []
        for ctx, cont in requests:
            logp = torch.log_softmax(theirs_model(torch.tensor([ctx + cont[:-1]])).logits[0].double(), -1)
            want.append(float(logp[-len(cont):].gather(1, torch.tensor(cont)[:, None]).sum()))

    def scored(model):                       # as measure.evaluate scores tasks: packed rows of 256 tokens
        found, cut = score.logliks(measure.task_scorer(evaluate.Config(), model, 2, 256), {"t": items})
        assert cut == 0
        return np.concatenate(found["t"])

    delta = np.abs(scored(net) - want).max()
    dropped = np.abs(scored(dropping) - want).max()
    ids = rng.integers(3, 300, size=(1, PROMPT))
    with torch.no_grad():
        theirs_logits = theirs_model(torch.tensor(ids)).logits.numpy()
    logits_delta = np.abs(np.asarray(net.logits(net(jnp.asarray(ids, jnp.int32))[0])) - theirs_logits).max()
    print(f"{len(requests)} answers: max |loglik delta| {delta:.2e} dropless, {dropped:.2f} at capacity "
          f"1.25; logits on {PROMPT} tokens {logits_delta:.2e}")
    assert delta <= 1e-4 and logits_delta <= 1e-4
    assert dropped > 1e-2
    setting = measure.scoring_setting(evaluate.Config(), net.config, GLM)
    assert setting == {"max_length": 2048, "moe_capacity_factor": 0.0, "trained_moe_capacity_factor": 1.25}
