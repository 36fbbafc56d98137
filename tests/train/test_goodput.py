"""The goodput (stages/train/planning/goodput.py): checkpoint saves, evaluations and restarts against hand
computations, the plan's days and text, the slice search's ranking, and the hardware fields' refusals.

    PYTHONPATH=$PWD .venv/bin/python -m pytest -q tests/train/test_goodput.py
"""

from __future__ import annotations

import dataclasses
import math

import pytest

from pipeline import config, sweep  # noqa: F401  (sweep registers the gin bindings run files may use)
from stages.train.mesh import MeshConfig
from stages.train.model_config import ModelConfig, param_counts
from stages.train.optimizer_config import OptimizerConfig
from stages.train.planning import devices, figures, goodput, planner, search, shards, step_time
from stages.train.planning.hardware import INTERRUPTIONS_PER_CHIP_HOUR, HardwareConfig
from stages.train.stage_config import Config
from tests.conftest import REPO

MODEL = ModelConfig(vocab_size=1024, d_model=256, n_layers=4, n_heads=4, n_kv_heads=2, mlp_dim=512,
                    max_seq_len=512, remat="full")
V5P = devices.get("tpu-v5p")
FSDP4 = MeshConfig(fsdp=4)


def _cfg(model=MODEL, chips=4, mesh=FSDP4, **hw) -> Config:
    """1,000 steps of 16 x 512 tokens on `chips` v5p chips: a checkpoint every 100 steps, 2 evaluation
    batches at steps 300, 600, 900 and 1,000."""
    return Config(model=model, seq_len=512, global_batch=16, steps=1000, checkpoint_every=100, eval_every=300,
                  eval_batches=2, optimizer=OptimizerConfig(warmup_steps=10), mesh=mesh,
                  hardware=HardwareConfig(device="tpu-v5p", chips=chips, **hw))


def test_checkpoints_block_for_the_host_copy_and_stall_only_where_a_write_outlasts_the_interval():
    p = planner.plan(_cfg())
    g = p.goodput
    # The state, whole: every parameter and AdamW's two moments, float32.
    assert g.state_bytes == sum(param_counts(MODEL).values()) * 4 * 3
    shard = p.per_device["params"] + p.per_device["optimizer"]
    assert g.shard_bytes == shard and g.host_bytes == 4 * shard          # a v5p host drives 4 chips
    copy, write, interval = shard / 32e9, 4 * shard / 1e9, 100 * p.step_s
    assert g.copy_s == pytest.approx(copy) and g.write_s == pytest.approx(write)
    assert g.interval_s == pytest.approx(interval) and write < interval
    # 10 periodic saves block for their copies; the final, synchronous save for its copy and write.
    assert g.checkpoints == 10 and g.checkpoint_s == pytest.approx(10 * copy + copy + write)
    # At 1 kB/s each write outlasts the 100 steps between saves: the next save waits the difference.
    slow = planner.plan(_cfg(storage_bytes_per_s=1e3)).goodput
    write = 4 * shard / 1e3
    assert slow.checkpoint_s == pytest.approx(10 * (copy + write - interval) + copy + write)


def test_an_evaluation_batch_costs_the_forward_pass_of_a_step_without_remat():
    # One chip, no collectives: the forward matmuls and attention at the calibrated rates, and a third of the
    # memory-bound work without the optimizer's update.
    cfg = _cfg(chips=1, mesh=MeshConfig())
    p = planner.plan(cfg)
    eff, _ = step_time.efficiency(V5P)
    tokens = 16 * 512
    rate = V5P.peak_flops * eff.matmul
    matmuls = tokens * sum(step_time.matmul_flops(MODEL, 1, tokens).values()) / rate
    attention = tokens * 2 * 512 * 4 * 64 * 4 / (rate * eff.attention)
    none = dataclasses.replace(cfg, model=dataclasses.replace(MODEL, remat="none"))
    update = 7 * shards.param_bytes(MODEL, p.mesh, 4)     # parameters, gradients, 2 moments read, 3 written
    memory = (step_time.memory_bytes_per_step(none, p.mesh, 16) - update) / (V5P.hbm_bytes_per_s * eff.memory)
    memory /= 3
    g = p.goodput
    assert g.batch_s == pytest.approx(matmuls + attention + memory)
    # Every 300 steps and after the last: 300, 600, 900, 1,000.
    assert g.evaluations == 4 and g.eval_s == pytest.approx(4 * 2 * g.batch_s)
    assert planner.plan(dataclasses.replace(cfg, eval_every=0)).goodput.eval_s == 0


def test_restarts_cost_the_restart_the_restore_and_half_an_interval_over_the_whole_wall_clock():
    cfg = _cfg(interruptions_per_chip_hour=1e-3, restart_s=120)
    p = planner.plan(cfg)
    g = p.goodput
    per = 120 + g.write_s + g.interval_s / 2             # the restore reads what a host wrote
    assert g.restore_s == pytest.approx(g.write_s) and g.interruption_s == pytest.approx(per)
    rate = 1e-3 * 4 / 3600                               # a second, all 4 chips
    base = g.train_s + g.checkpoint_s + g.eval_s
    wall = base / (1 - rate * per)
    assert g.restart_s == pytest.approx(wall - base) and g.interruptions == pytest.approx(rate * wall)
    assert g.share == pytest.approx(g.train_s / wall)
    assert p.days == pytest.approx(1000 * p.step_s / 86400 / g.share) and p.days > p.train_days
    assert planner.plan(_cfg(interruptions_per_chip_hour=0)).goodput.restart_s == 0


def test_the_default_failure_rate_is_llama_3s_and_a_rate_faster_than_recovery_never_finishes():
    assert HardwareConfig().interruptions_per_chip_hour == INTERRUPTIONS_PER_CHIP_HOUR
    days = 466 / INTERRUPTIONS_PER_CHIP_HOUR / 16_384 / 24       # 466 interruptions on 16,384 GPUs
    assert days == pytest.approx(54)
    p = planner.plan(_cfg(interruptions_per_chip_hour=1e3))
    assert p.goodput.share == 0 and p.days == math.inf
    restarts = next(line for line in p.render().splitlines() if line.startswith("    restarts: "))
    assert "longer than the time between them" in restarts, restarts


def test_the_plan_prints_each_term_and_the_days_before_and_after():
    p = planner.plan(_cfg())
    g = p.goodput
    lines = p.render().splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("  goodput: "))
    assert lines[head] == (f"  goodput: {g.share:.1%} of the wall-clock time trains: "
                           f"{figures.num(p.train_days)} days of steps take {figures.num(p.days)} days")
    assert lines[head + 1].startswith("    checkpoints: 10 + the final one of ")
    assert "every 100 steps, asynchronous" in lines[head + 1]
    assert lines[head + 2].startswith("    evaluations: 4 x 2 batches of 16 x 512 tokens, forward only, ")
    assert lines[head + 3].startswith("    restarts: "), lines[head + 3]
    assert "Llama 3 405B's 466 in 54 days on 16,384 GPUs" in lines[head + 3]
    assert lines[-1].startswith("  verdict: ")


def test_every_term_of_the_step_model_has_a_forward_share():
    """goodput.FORWARD_SHARE names every term step_time.predict makes (a renamed term would fall back to a
    guess): fsdp, expert, tensor and data axes, an MoE, an offload policy."""
    moe = dataclasses.replace(MODEL, n_experts=8, n_experts_per_token=2, moe_mlp_dim=128, n_dense_layers=1,
                              moe_capacity_factor=1.25, remat="offload_full")
    names = set()
    for cfg in (_cfg(model=moe, chips=8, mesh=MeshConfig(data=2, fsdp=2, expert=2)),
                _cfg(chips=8, mesh=MeshConfig(data=2, fsdp=2, tensor=2)),
                _cfg(model=dataclasses.replace(moe, moe_capacity_factor=0.0), chips=1, mesh=MeshConfig())):
        names |= {t.name for t in planner.plan(cfg).predicted.terms}
    unnamed = {n for n in names if n != "memory-bound ops" and not any(n.startswith(prefix) for prefix, _ in
                                                                      goodput.FORWARD_SHARE)}
    assert not unnamed and len(names) >= 10, (unnamed, names)


@pytest.mark.parametrize("field, value, says", [
    ("storage_bytes_per_s", 0, "storage_bytes_per_s=0 must be a finite number > 0"),
    ("storage_bytes_per_s", "fast", "storage_bytes_per_s='fast' must be a finite number > 0"),
    ("interruptions_per_chip_hour", -1e-5, "interruptions_per_chip_hour=-1e-05 must be a finite number >= 0"),
    ("restart_s", float("nan"), "restart_s=nan must be a finite number >= 0"),
    ("restart_s", float("inf"), "restart_s=inf must be a finite number >= 0"),
])
def test_a_bad_goodput_assumption_is_refused_naming_it(field, value, says):
    with pytest.raises(ValueError, match=f"^HardwareConfig: {says}"):
        HardwareConfig(**{field: value})


def test_the_slice_search_ranks_by_days_with_goodput():
    """Evaluations that double the run make the search take a larger slice (v5p-8: 0.56 days of steps alone,
    1.09 with them; v5p-16: 0.57), and its answer's days are the steps over the goodput."""
    cfg = Config(model=dataclasses.replace(MODEL, remat="none"), seq_len=512, global_batch=64,
                 steps=45_000_000, eval_every=0, checkpoint_every=1_000_000,
                 optimizer=OptimizerConfig(warmup_steps=10),
                 hardware=HardwareConfig(device="tpu-v5p", interruptions_per_chip_hour=0))
    plain = search.smallest_slice(cfg, 1, elsewhere=False).found
    assert plain is not None and plain.chips == 4 and plain.goodput.share > 0.99
    evaluated = dataclasses.replace(cfg, eval_every=1, eval_batches=3)
    found = search.smallest_slice(evaluated, 1, elsewhere=False).found
    assert found is not None and found.chips == 8, found and found.chips
    assert found.days <= 1 and found.days == pytest.approx(found.train_days / found.goodput.share)
    assert found.goodput.share < 0.6


def test_a_layout_with_the_faster_step_loses_where_its_checkpoints_cost_more():
    """A checkpoint every 50 steps of a millisecond: data 4 x fsdp 1 steps fastest on v5p-8, but each host
    writes 4 whole copies of the state and the writes outlast the steps between saves; fsdp 4 writes a
    quarter of that and takes fewer days, so the search ranks it first."""
    cfg = Config(model=dataclasses.replace(MODEL, remat="none"), seq_len=512, global_batch=64,
                 steps=45_000_000, eval_every=0, checkpoint_every=50,
                 optimizer=OptimizerConfig(warmup_steps=10),
                 hardware=HardwareConfig(device="tpu-v5p", topology="v5p:2x2x1",
                                         interruptions_per_chip_hour=0))
    ranked, _ = search._fastest_layouts(dataclasses.replace(cfg, mesh=MeshConfig(data=-1)), 4)
    fastest_step = min(ranked, key=lambda p: p.predicted.seconds)
    first = ranked[0]
    assert fastest_step.mesh.data == 4 and first.mesh.fsdp == 4, (fastest_step.mesh, first.mesh)
    assert first.predicted.seconds > fastest_step.predicted.seconds and first.days < fastest_step.days
    assert fastest_step.goodput.write_s > fastest_step.goodput.interval_s


def test_the_flagship_trains_98_percent_of_its_wall_clock_time():
    """gin/600b.gin: 28.4 days of steps take 29.1 days. 7.2 TB of state (598B float32 parameters and two AdamW
    moments) every 500 steps blocks 0.22 s a save (6.5 GiB a chip at 32 GB/s; each host's 26 GiB write takes
    28 s of the 85 minutes between saves); 120 evaluations of 16 global batches forward, 2.99 s each; 15.7
    interruptions at Llama 3's rate on 1,024 chips, each 10 minutes + 28 s + 43 minutes of lost steps."""
    p = planner.plan(config.load([f"{REPO}/gin/600b.gin"], []).stages["train"].config)
    g = p.goodput
    assert figures.num(p.train_days) == "28.4" and figures.num(p.days) == "29.1"
    assert f"{g.share:.1%}" == "97.8%"
    assert g.checkpoints == 480 and g.evaluations == 120 and figures.num(g.interruptions) == "15.7"
    assert 7.1e12 < g.state_bytes < 7.3e12 and g.write_s < g.interval_s
    # The restarts cost the most: 2.0% of the wall-clock time, the evaluations 0.23%, the saves 0.01%.
    assert g.restart_s > g.eval_s > g.checkpoint_s
    assert "  goodput: 97.8% of the wall-clock time trains: 28.4 days of steps take 29.1 days" in p.render()
