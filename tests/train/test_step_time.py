"""The step-time model (stages/train/planning/step_time.py) against hand computations, and its calibration
rows."""

from __future__ import annotations

import dataclasses
import os

import pytest

from benchmarks import step_time as bench
from stages.train import model_config
from stages.train.mesh import Mesh, MeshConfig
from stages.train.model_config import ModelConfig
from stages.train.optimizer_config import OptimizerConfig
from stages.train.planning import devices, figures, planner, shards, step_time
from stages.train.planning.hardware import HardwareConfig
from stages.train.stage_config import Config

MODEL = ModelConfig(vocab_size=1024, d_model=256, n_layers=4, n_heads=4, n_kv_heads=2, mlp_dim=512,
                    max_seq_len=512, remat="none")


FSDP4 = MeshConfig(fsdp=4)


def _cfg(model=MODEL, mesh=FSDP4, device="tpu-v5p", batch=16, accum=1, **hw) -> Config:
    return Config(model=model, seq_len=512, global_batch=batch, steps=1000,
                  optimizer=OptimizerConfig(grad_accum_steps=accum, warmup_steps=10),
                  mesh=mesh, hardware=HardwareConfig(device=device, chips=hw.pop("chips", 4), **hw))


def _predicted(cfg) -> step_time.StepTime:
    return planner.plan(cfg, advise=False).predicted


def test_matmul_flops_per_token_are_the_hand_counts():
    g = step_time.matmul_flops(MODEL, 1, 512)
    D, H, F, L = 256, 64, 512, 4
    assert g["qkv"] == 2 * D * (4 + 2 * 2) * H * L and g["out"] == 2 * 4 * H * D * L
    assert g["mlp_in"] == 2 * 2 * D * F * L and g["mlp_out"] == 2 * D * F * L
    assert g["unembed"] == 2 * D * 1024 and g["router"] == g["experts_in"] == g["experts_out"] == 0
    # Training FLOPs: 3x the forward matmuls and the causal attention = model_config.flops_per_token.
    from stages.train.model_config import flops_per_token
    attention = 2 * 512 * 4 * H * L
    assert 3 * (sum(g.values()) + attention) == flops_per_token(MODEL, 512)


def test_an_moe_layer_counts_its_capacity_rows():
    moe = dataclasses.replace(MODEL, n_experts=8, n_experts_per_token=2, moe_mlp_dim=128, n_dense_layers=1,
                              moe_capacity_factor=1.5)
    tokens = 1024
    g = step_time.matmul_flops(moe, 2, tokens)
    rows = 8 * 384                                  # E x C, C = ceil(1.5 x 1024 x 2 / 8)
    assert g["experts_in"] == 2 * 2 * 256 * 128 * rows / tokens * 3
    assert g["router"] == 2 * 256 * 8 * 3 and g["mlp_in"] == 2 * 2 * 256 * 512 * 1


@pytest.mark.parametrize("remat, extra", [("none", 0), ("save_dots", 0), ("minimal", 1), ("full", 1),
                                          ("offload_full", 1)])
def test_remat_recomputes_the_forward_pass_it_does_not_keep(remat, extra):
    """full recomputes every matmul but the down projections; the matmul term grows by exactly that."""
    base = _predicted(_cfg()).term("matmuls").seconds
    t = _predicted(_cfg(dataclasses.replace(MODEL, remat=remat))).term("matmuls").seconds
    g = step_time.matmul_flops(MODEL, 1, 4 * 512)
    again = {"none": set(), "save_dots": set(), "minimal": {"mlp_in"}, "full": {"qkv", "out", "mlp_in"},
             "offload_full": {"qkv", "out", "mlp_in"}}[remat]
    forward = sum(g.values())
    assert t / base == pytest.approx((3 * forward + extra * sum(g[k] for k in again)) / (3 * forward))


def test_fsdp_hides_behind_compute_and_the_logits_all_reduce_does_not():
    """The overlap rule: 4 sequences of 512 a chip hide every layer's FSDP collectives behind the previous
    layer's compute, all but their HBM passes; the loss's logits all-reduce is on the critical path; so the
    step is compute plus those two. At one sequence a GPU, a layer's collectives over NVLink outlast its
    compute, and part of them shows."""
    t = _predicted(_cfg())
    compute = sum(x.seconds for x in t.terms if x.name in ("matmuls", "attention", "memory-bound ops"))
    fsdp, logits, passes = t.term("fsdp"), t.term("logits"), t.term("HBM passes")
    assert fsdp.seconds > 0 and fsdp.exposed == 0
    assert logits.seconds > 0 and logits.exposed == logits.seconds
    assert passes.seconds > 0 and passes.exposed == passes.seconds
    assert t.seconds == pytest.approx(compute + logits.seconds + passes.seconds)
    assert t.mfu == pytest.approx(t.model_flops / (t.seconds * 459e12))
    small = _predicted(_cfg(batch=4, device="h100", model=dataclasses.replace(
        MODEL, d_model=2048, n_heads=16, n_kv_heads=16, mlp_dim=8192)))
    fsdp = small.term("fsdp")
    assert 0 < fsdp.exposed < fsdp.seconds


def test_fsdp_bytes_are_each_layer_gathered_twice_and_reduce_scattered_once():
    cfg = _cfg()
    t = _predicted(cfg)
    layer = sum(shards.shard_size(shape[1:], names[1:], Mesh())
                for name, (shape, names) in model_config.param_layout(MODEL).items()
                if name.startswith("layers.") and len(shape) >= 3)          # the matrices: norms stay whole
    device = devices.get("tpu-v5p")
    eff, _ = step_time.efficiency(device)
    expected = 4 * 3 * layer * 2 * 3 / 4 / (device.ici_bytes_per_s * eff.ici)
    assert t.term("fsdp").seconds == pytest.approx(expected)
    # What they still take from compute: each gathered byte written and read again (2 passes, twice), each
    # reduced one read twice and written (3 passes), at the memory term's share of HBM bandwidth.
    passes = 4 * layer * 2 * (2 + 2 + 3) / (device.hbm_bytes_per_s * eff.memory)
    assert t.term("HBM passes").seconds == pytest.approx(passes)


def test_all_to_all_crosses_the_torus_mean_distance():
    v5p, h100 = devices.get("tpu-v5p"), devices.get("h100")
    assert step_time.all_to_all_hops(v5p, 64) == pytest.approx(3.0)      # a 4x4x4 cube: 3 sides of 4 / 4
    assert step_time.all_to_all_hops(devices.get("tpu-v6e"), 256) == pytest.approx(8.0)   # 16x16: 2 x 4
    assert step_time.all_to_all_hops(v5p, 8) == pytest.approx(1.5)        # 2x2x2
    assert step_time.all_to_all_hops(v5p, 1) == 1.0 and step_time.all_to_all_hops(h100, 8) == 1.0


def test_an_assumed_mfu_sets_the_days_and_the_prediction_is_printed_beside_it():
    predicted = planner.plan(_cfg())
    assumed = planner.plan(_cfg(mfu=0.25))
    assert predicted.step_s == pytest.approx(predicted.predicted.seconds)
    assert assumed.step_s != pytest.approx(assumed.predicted.seconds)
    text = assumed.render()
    assert "time, predicted:" in text and "time at the assumed 25% MFU" in text
    assert "time at the assumed" not in predicted.render()


def test_a_device_without_calibrated_efficiencies_says_whose_it_borrows():
    p = planner.plan(_cfg(device="tpu-v5e"))
    assert "TPU v5e borrows tpu-v5p's efficiencies, none calibrated for it" in p.render()


def test_every_published_run_file_states_its_figure_and_role_and_the_calibrated_constants_are_the_fits():
    files = bench.run_files()
    roles = [bench.published(p)[1] for p in files]
    assert len(files) >= 6 and sum(r == "held out" for r in roles) >= 6
    fitted = bench.calibrate()
    for device, constants in fitted.items():
        for name, value in constants.items():
            stored = getattr(step_time.EFFICIENCY[device], name)
            assert stored == pytest.approx(value, abs=0.006), (device, name)


def test_a_run_file_naming_an_unknown_device_is_one_row_and_the_others_are_computed(tmp_path, capsys):
    """One bad published file once stopped the benchmark with a traceback and no row for the rest."""
    good = bench.run_files()[:2]
    bad = tmp_path / "a100_node.gin"
    bad.write_text(f"# published: 1000 tokens/s per chip\n# role: held out\ninclude '{good[0]}'\n"
                   'train.HardwareConfig.device = "a100"\n')
    result = bench.measure(str(tmp_path), files=[good[0], str(bad), good[1]])
    assert result["failed"] == ["a100_node"]
    error = result["rows"]["a100_node"]["error"]
    assert str(bad) in error and "device='a100'" in error, error
    assert all(f"'{name}'" in error for name in devices.DEVICES), error          # the valid devices
    for path in good:                                                             # computed as on their own
        assert result["rows"][os.path.basename(path).removesuffix(".gin")] == bench.row(path)
    assert result["judged"] == sum(not bench.published(p)[1].startswith("reference") for p in good)
    lines = [line for line in capsys.readouterr().out.splitlines() if "a100" in line]
    assert len(lines) == 1 and lines[0].startswith("a100_node ") and lines[0].endswith(f"  error: {error}")


HLO = """HloModule m

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%all-reduce-scatter.1 (p: bf16[64,32]) -> bf16[16,32] {
  %p = bf16[64,32]{1,0} parameter(0)
  %all-reduce.9 = bf16[64,32]{1,0} all-reduce(%p), replica_groups={{0,1,2,3}}, to_apply=%add
  ROOT %d = bf16[16,32]{1,0} dynamic-slice(%all-reduce.9)
}

%cond (c: (s32[], bf16[8,32])) -> pred[] {
  %c = (s32[], bf16[8,32]) parameter(0)
  %n = s32[] constant(6)
  %i = s32[] get-tuple-element(%c), index=0
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

%body (c: (s32[], bf16[8,32])) -> (s32[], bf16[8,32]) {
  %c = (s32[], bf16[8,32]) parameter(0)
  %w = bf16[8,32]{1,0} get-tuple-element(%c), index=1
  %all-gather.1 = bf16[1,32,32]{2,1,0} all-gather(%w), replica_groups=mesh['axis_0'=4,'axis_1'=2] {'axis_0'},
dimensions={1}, metadata={op_name="jit(step)/while/body/dot_general"}
  %f = bf16[16,32]{1,0} fusion(%w), kind=kCustom, calls=%all-reduce-scatter.1
  ROOT %t = (s32[], bf16[8,32]) tuple(%i, %w)
}

ENTRY %main (x: bf16[8,32]) -> bf16[8,32] {
  %x = bf16[8,32]{1,0} parameter(0)
  %loop = (s32[], bf16[8,32]) while(%init), condition=%cond, body=%body
  %ar = (f32[4], f32[4]) all-reduce(%y, %z), replica_groups=[2,4]<=[8], to_apply=%add
  %a2a-start = (bf16[4,8], bf16[4,8]) all-to-all-start(%x), replica_groups={{0,1}}
  %a2a = bf16[4,8]{1,0} all-to-all-done(%a2a-start)
  ROOT %r = bf16[8,32]{1,0} copy(%x)
}
"""


def test_hlo_collectives_count_loops_fusions_tuples_and_async_pairs():
    from stages.train.planning import hlo

    cs = hlo.collectives(HLO)
    kinds = {(c.kind, c.shapes, c.group, c.count) for c in cs}
    assert ("all-gather", (("bf16", (1, 32, 32)),), 4, 6) in kinds         # a scan body: its trip count
    assert ("reduce-scatter", (("bf16", (64, 32)),), 4, 6) in kinds        # the all-reduce-scatter fusion
    assert ("all-reduce", (("f32", (4,)), ("f32", (4,))), 4, 1) in kinds   # a tuple, iota replica groups
    assert ("all-to-all", (("bf16", (4, 8)),), 2, 1) in kinds              # the -done of an async pair
    assert len(cs) == 4
    assert hlo.bytes_by_kind(cs) == {"all-gather": 6 * 32 * 32 * 2, "reduce-scatter": 6 * 64 * 32 * 2,
                                     "all-reduce": 32, "all-to-all": 64, "collective-permute": 0}


def test_a_plan_whose_loss_chunks_cost_a_tenth_of_the_step_says_what_one_chunk_would_save():
    """gin/1b.gin: 4,096-token chunks of a 2M-token micro-batch under fsdp 64: every chip computes and
    all-reduces all 512 chunks' partial logits, the step's largest term; one chunk removes it."""
    from pipeline import config
    from tests.conftest import REPO

    p = planner.plan(config.load([f"{REPO}/gin/1b.gin"]).stages["train"].config)
    hint = next(line for line in p.render().splitlines() if line.startswith("    hint: "))
    assert hint.startswith("    hint: train.Config.loss_chunk=4,096 splits each micro-batch of 2,097,152 "
                           "tokens into 512 chunks"), hint
    one = planner.plan(dataclasses.replace(p.config, loss_chunk=2_097_152))
    # 512 chunks of 4,096 rows a chip, all-reduced forward and backward, against its own 32,768 rows once.
    assert one.predicted.term("logits").exposed == pytest.approx(p.predicted.term("logits").exposed / 64)
    assert f"predicts {figures.num(one.predicted.seconds)} s/step" in hint
    flagship = planner.plan(config.load([f"{REPO}/gin/600b.gin"]).stages["train"].config)
    assert "hint:" not in flagship.render()


def test_the_grouped_matmul_is_charged_the_tiles_the_megablox_kernel_visits():
    """Each expert's rows start a tile of the megablox kernel, sharing the one they start in: a call visits
    ceil(rows / tile) + E - 1 tiles. The count is the kernel's own (its group metadata, plain jnp, run here
    on random routings), and DeepSeek-V3's published run (6 x 8K tokens a chip, top-8 of 256 experts,
    MaxText's 512-row tiles) does 1.33x the work its rows hold."""
    import importlib

    import jax.numpy as jnp
    import numpy as np

    gmm = importlib.import_module("jax.experimental.pallas.ops.tpu.megablox.gmm")
    m = ModelConfig(vocab_size=512, d_model=64, n_layers=2, n_heads=4, n_kv_heads=4, max_seq_len=64,
                    n_experts=64, n_experts_per_token=4, moe_impl="megablox", moe_tile_rows=128)
    tokens = 4096
    rows = tokens * m.n_experts_per_token
    rng = np.random.default_rng(0)
    for _ in range(3):
        sizes = np.bincount(rng.integers(0, m.n_experts, rows), minlength=m.n_experts).astype(np.int32)
        _, visited = gmm.make_group_metadata(group_sizes=jnp.asarray(sizes), m=rows, tm=m.moe_tile_rows,
                                             start_group=jnp.int32(0), num_nonzero_groups=m.n_experts,
                                             visit_empty_groups=False)
        charged = step_time.grouped_tiles(m, tokens, "tpu-v5p") * rows / m.moe_tile_rows
        # Fewer only where a boundary lands on a tile's edge.
        assert charged - 3 <= int(visited) <= charged, (int(visited), charged)
    deepseek = dataclasses.replace(m, n_experts=256, n_experts_per_token=8, moe_tile_rows=512)
    assert step_time.grouped_tiles(deepseek, 6 * 8192, "tpu-v5p") == pytest.approx((768 + 255) / 768)
    auto = dataclasses.replace(deepseek, moe_impl="auto")
    assert step_time.grouped_tiles(auto, 6 * 8192, "tpu-v5p") == step_time.grouped_tiles(deepseek, 6 * 8192,
                                                                                          "tpu-v5p")
    assert step_time.grouped_tiles(auto, 6 * 8192, "h100") == 1.0              # ragged_dot: its rows
    with pytest.raises(ValueError, match="moe_tile_rows=100 must be a positive multiple of 8"):
        dataclasses.replace(deepseek, moe_tile_rows=100)


def test_an_expert_axis_across_slices_sends_the_other_slices_share_over_the_network():
    """expert 16 over 2 slices (dcn_expert 2): half of a device's buffer is bound for the other slice and
    crosses the data-center network; the other half is an all-to-all among the 8 chips of its own."""
    whole, dcn, n = 900e9 * 0.4, 50e9 * 0.7, 8e9
    links = step_time.Links(devices.get("h100"), whole)
    assert links.all_to_all(n, 16, 2, dcn) == pytest.approx(n / 2 / dcn + n / 2 * 7 / 8 / whole)
    assert links.all_to_all(n, 8) == pytest.approx(n * 7 / 8 / whole)          # one slice: NVLink alone
    assert links.all_to_all(n, 2, 2, dcn) == pytest.approx(n / 2 / dcn)        # one chip a slice
