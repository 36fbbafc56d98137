"""Training state is born sharded and stays sharded: the real init and train step on 8 simulated CPU
devices, compiled under meshes from data 8 to fsdp 8 (one subprocess, since the device count is fixed
when JAX starts)."""

import textwrap

import pytest

from tests.conftest import run_on_simulated_devices

SCRIPT = textwrap.dedent("""
    import json
    import jax, jax.numpy as jnp
    from stages import train
    from stages.train import loop, sharding
    from stages.train.mesh import MeshConfig
    from stages.train.model_config import ModelConfig
    from stages.train.optimizer_config import OptimizerConfig

    assert jax.device_count() == 8, jax.devices()
    m = ModelConfig(vocab_size=2048, d_model=256, n_layers=4, n_heads=8, n_kv_heads=8, mlp_dim=1024,
                    max_seq_len=64, dtype="float32", attention_impl="xla")
    cfg = train.Config(model=m, optimizer=OptimizerConfig(warmup_steps=1), steps=10, seq_len=64,
                       global_batch=8)
    out = {}
    for fsdp in (1, 2, 4, 8):
        mesh = sharding.make_mesh(MeshConfig(data=-1, fsdp=fsdp))
        graphdef, tx, init = loop.init_program(m, cfg.optimizer_for_run(), mesh)
        init_memory = init.lower(0).compile().memory_analysis()
        params, opt_state = init(0)
        held = {}
        for leaf in jax.tree.leaves((params, opt_state)):
            for shard in leaf.addressable_shards:
                held[shard.device.id] = held.get(shard.device.id, 0) + shard.data.nbytes
        step_fn, _ = loop.jit_steps(graphdef, tx, loop.step_options(cfg, 1), sharding.shardings_of(params),
                                    sharding.shardings_of(opt_state), mesh)
        batch = jax.ShapeDtypeStruct((8, 65), jnp.int32, sharding=sharding.batch_sharding(mesh))
        with jax.set_mesh(mesh):
            compiled = step_fn.lower(params, opt_state, batch).compile()
        specs = lambda tree: [str(getattr(x, "sharding", x).spec) for x in jax.tree.leaves(tree)]
        out[fsdp] = {"state_bytes": sum(x.nbytes for x in jax.tree.leaves((params, opt_state))),
                     "init_peak": init_memory.output_size_in_bytes + init_memory.temp_size_in_bytes,
                     "held_max": max(held.values()),
                     "step_temp": compiled.memory_analysis().temp_size_in_bytes,
                     "params_in": specs(params), "params_out": specs(compiled.output_shardings[0]),
                     "opt_in": specs(opt_state), "opt_out": specs(compiled.output_shardings[1]),
                     "wq": str(params["layers"]["wq"][...].sharding.spec)}
    print("RESULT " + json.dumps(out))
""")


@pytest.fixture(scope="module")
def results():
    return {int(k): v for k, v in run_on_simulated_devices(SCRIPT).items()}


def test_no_device_ever_holds_more_than_its_share_at_init(results):
    whole = results[1]["state_bytes"]                 # params + Adam moments: the global arrays' size
    for fsdp, r in results.items():
        share = whole / fsdp
        assert r["held_max"] <= share + 1024                       # what each device holds afterwards
        # ... and at its peak while the one jitted init program runs (its outputs and its scratch space):
        # within a constant factor of the share, never the whole model.
        assert r["init_peak"] <= 2 * share + 2**20, (fsdp, r["init_peak"], share)
    assert results[8]["init_peak"] * 7 < results[1]["init_peak"]


def test_the_train_step_keeps_params_and_optimizer_state_in_their_shardings(results):
    for r in results.values():
        assert r["params_out"] == r["params_in"] and r["opt_out"] == r["opt_in"]
    wq = "P(None, ('fsdp', 'expert'), 'tensor', None)"       # embed over fsdp and the (size-1) expert axis
    assert results[8]["wq"] == wq
    assert wq in results[8]["opt_in"]                          # Adam moments of wq


def test_per_device_scratch_memory_drops_as_fsdp_grows(results):
    temps = [results[f]["step_temp"] for f in (1, 2, 4, 8)]
    assert temps == sorted(temps, reverse=True) and temps[-1] < 0.7 * temps[0], temps
