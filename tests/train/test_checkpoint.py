import os
import signal
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from stages.io import storage
from stages.train import checkpoint
from tests import jax_env

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _state(seed=0, step=3):
    """params (an nnx.State, one bf16 leaf) + adam state after one real update + step."""
    net = nnx.Linear(4, 3, rngs=nnx.Rngs(seed))
    _, params = nnx.split(net, nnx.Param)
    params["bias"].set_value(params["bias"].get_value().astype(jnp.bfloat16) + 0.1)
    tx = optax.adam(1e-2)
    opt_state = tx.init(params)
    grads = jax.tree.map(lambda p: jnp.full_like(p, 0.5), params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return {"params": optax.apply_updates(params, updates), "opt_state": opt_state, "step": jnp.int32(step)}


def _assert_bitwise_equal(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        assert isinstance(y, jax.Array) and x.dtype == y.dtype and x.shape == y.shape
        np.testing.assert_array_equal(np.atleast_1d(x).view(np.uint8), np.atleast_1d(y).view(np.uint8))


def test_round_trip_is_bitwise(tmp_path):
    state = _state()
    with checkpoint.Checkpointer(str(tmp_path / "ck"), every=1, async_save=False) as ckpt:
        assert ckpt.latest_step() is None
        assert ckpt.save(3, state)
        restored = ckpt.restore(3, jax.eval_shape(lambda: state))
    _assert_bitwise_equal(state, restored)
    assert int(restored["step"]) == 3
    assert isinstance(restored["params"], nnx.State)
    assert jax.tree.leaves(restored["params"])[0].dtype == jnp.bfloat16


def test_every_force_and_keep(tmp_path):
    state = _state()
    ckpt = checkpoint.Checkpointer(str(tmp_path / "ck"), keep=2, every=2, async_save=False)
    saved = [ckpt.save(s, state) for s in range(1, 7)]
    assert saved == [False, True, False, True, False, True]
    assert ckpt.all_steps() == [4, 6]                         # step 2 deleted: keep=2
    assert ckpt.save(7, state, force=True)
    assert not ckpt.save(7, state, force=True)               # already there (periodic + preemption save)
    assert ckpt.all_steps() == [6, 7] and ckpt.latest_step() == 7
    ckpt.close()
    assert sorted(os.listdir(tmp_path / "ck")) == ["6", "7"]


def test_async_save_then_restore_in_a_new_manager(tmp_path):
    state = _state(seed=1, step=10)
    ckpt = checkpoint.Checkpointer(str(tmp_path / "ck"), every=5, async_save=True)
    assert ckpt.save(10, state)
    ckpt.wait()
    ckpt.close()
    again = checkpoint.Checkpointer(str(tmp_path / "ck"), every=5)     # a resumed run
    assert again.latest_step() == 10
    _assert_bitwise_equal(state, again.restore(again.latest_step(), state))
    params = again.restore(10, {"params": jax.eval_shape(lambda: state["params"])}, partial=True)
    _assert_bitwise_equal(state["params"], params["params"])
    with pytest.raises(ValueError, match="partial=True"):
        again.restore(10, {"params": state["params"]})
    again.close()


def test_restore_missing_checkpoint_is_a_clear_error(tmp_path):
    state = _state()
    ckpt = checkpoint.Checkpointer(str(tmp_path / "ck"), every=1, async_save=False)
    with pytest.raises(FileNotFoundError, match="holds steps none"):
        ckpt.restore(ckpt.latest_step(), state)
    ckpt.save(2, state)
    with pytest.raises(FileNotFoundError, match=r"no checkpoint for step 5 .* holds steps \[2\]"):
        ckpt.restore(5, state)
    with pytest.raises(ValueError, match="asks for"):
        ckpt.restore(2, {"params": state["params"], "ema": state["params"]}, partial=True)
    ckpt.close()


CHILD = textwrap.dedent("""
    import sys, time
    import jax.numpy as jnp
    from stages.train import checkpoint, stop

    ckpt = checkpoint.Checkpointer(sys.argv[1], every=1000)
    step = 0
    with stop.stop_requests() as requested:
        while True:                               # a training loop that never reaches a periodic save
            step += 1
            state = {"w": jnp.full((3,), float(step)), "step": jnp.int32(step)}
            ckpt.save(step, state)
            if requested.is_set():
                ckpt.save(step, state, force=True)
                ckpt.wait()
                ckpt.close()
                print("stopped", step, flush=True)
                sys.exit(0)
            if step == 3:
                print("ready", flush=True)
            time.sleep(0.01)
""")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_signal_saves_and_exits_cleanly(tmp_path, signum):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])),
               JAX_PLATFORMS="cpu")
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path / "ck")], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
    try:
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    stopped = int(out.split()[-1])
    assert stopped >= 3
    ckpt = checkpoint.Checkpointer(str(tmp_path / "ck"))
    assert ckpt.all_steps() == [stopped]
    restored = ckpt.restore(stopped, {"w": jax.ShapeDtypeStruct((3,), jnp.float32),
                                      "step": jax.ShapeDtypeStruct((), jnp.int32)})
    assert int(restored["step"]) == stopped and restored["w"].tolist() == [float(stopped)] * 3
    ckpt.close()


def test_gcs_round_trip(gcs_bucket):
    state = _state(step=4)
    ckpt = checkpoint.Checkpointer(f"{gcs_bucket}/run/checkpoints", keep=1, every=2)
    assert ckpt.save(2, state) and ckpt.save(4, state)
    ckpt.wait()
    assert ckpt.all_steps() == [4]
    _assert_bitwise_equal(state, ckpt.restore(4, jax.eval_shape(lambda: state)))
    ckpt.close()
    # Through gcsfs's core client: its experimental HNS one (GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT, on unless set
    # to false) waits out a 60 s gRPC time-out per bucket, which this test once caught by timing itself.
    fs, _ = storage.filesystem(f"{gcs_bucket}/run/checkpoints")
    assert type(fs).__name__ == "GCSFileSystem", type(fs)


RESHARD = textwrap.dedent("""
    import sys
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from stages.train import checkpoint

    mesh = Mesh(np.array(jax.devices()).reshape(2, 2), ("data", "fsdp"))
    w = jax.device_put(jnp.arange(32.0).reshape(8, 4), NamedSharding(mesh, P("fsdp", None)))
    ckpt = checkpoint.Checkpointer(sys.argv[1], every=1)
    ckpt.save(1, {"w": w, "step": jnp.int32(1)})
    ckpt.wait()
    target = NamedSharding(mesh, P(None, "data"))
    out = ckpt.restore(1, {"w": jax.ShapeDtypeStruct((8, 4), jnp.bfloat16, sharding=target),
                           "step": jax.ShapeDtypeStruct((), jnp.int32)})
    ckpt.close()
    assert out["w"].sharding == target and out["w"].dtype == jnp.bfloat16, (out["w"].sharding, out["w"].dtype)
    assert np.array_equal(np.asarray(out["w"], np.float32), np.asarray(w))
    print("ok")
""")


def test_restore_into_other_shardings_and_dtypes(tmp_path):
    # Four CPU devices need a fresh process (the device count is fixed when jax starts).
    script = tmp_path / "reshard.py"
    script.write_text(RESHARD)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])),
               JAX_PLATFORMS="cpu", XLA_FLAGS=jax_env.xla_flags("--xla_force_host_platform_device_count=4"))
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "ck")], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
