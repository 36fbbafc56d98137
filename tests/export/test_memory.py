"""The export never holds the model: peak resident memory of a subprocess exporting a checkpoint does not
grow with the model. Two checkpoints, 24 and 72 layers (~100 and ~300 MB of float32), are exported in
fresh processes; the larger one's peak growth (VmHWM after, less VmRSS before) is within 10% of the
200 MB difference of the smaller one's, and a small fraction of its model; and no JAX is imported.
It holds because the training checkpoint stores stacked layers one layer per chunk (checkpoint.py) and the
export reads one layer of one parameter at a time (checkpoint_arrays.py, stages/export)."""

import json
import subprocess
import sys
import textwrap

import pytest
from flax import nnx

from stages.train import model
from stages.train.model_config import ModelConfig, param_counts
from tests.export import helpers

SCRIPT = textwrap.dedent("""
    import json, pathlib, sys
    from stages import export
    from stages.train.checkpoint_arrays import CheckpointArrays
    from tests.export import helpers

    def status(field):       # bytes, from /proc/self/status
        line = next(l for l in open("/proc/self/status") if l.startswith(field + ":"))
        return int(line.split()[1]) * 1024

    tmp = pathlib.Path(sys.argv[1])
    CheckpointArrays(str(tmp / "train" / "checkpoint")).read("final_norm")    # TensorStore loaded and warm
    open("/proc/self/clear_refs", "w").write("5")      # resets the peak (VmHWM) to the current RSS
    before = status("VmRSS")
    inputs = {name: helpers.committed(name, tmp / name) for name in ("train", "tokenizer", "shard")}
    export.run(export.Config(), inputs, str(tmp / "export"), str(tmp / "work"))
    print(json.dumps({"grew": status("VmHWM") - before, "jax": "jax" in sys.modules}))
""")


def _export_in_a_subprocess(tmp, layers: int) -> tuple[dict, int]:
    cfg = ModelConfig(vocab_size=320, d_model=256, n_layers=layers, n_heads=4, n_kv_heads=4, mlp_dim=1024,
                      max_seq_len=256)
    params = nnx.split(model.Transformer(cfg, rngs=nnx.Rngs(0)), nnx.Param)[1]
    helpers.write_inputs(tmp, cfg, params, helpers.tokenizer_model())
    del params
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp)], capture_output=True, text=True, check=True)
    model_bytes = 4 * sum(param_counts(cfg).values())
    assert (tmp / "export" / "model.safetensors").stat().st_size > model_bytes
    return json.loads(out.stdout.strip().splitlines()[-1]), model_bytes


@pytest.mark.slow
def test_peak_memory_of_an_export_does_not_grow_with_the_model(tmp_path):
    small, small_bytes = _export_in_a_subprocess(tmp_path / "small", 24)
    big, big_bytes = _export_in_a_subprocess(tmp_path / "big", 72)
    print(f"export peak growth: {small['grew'] / 1e6:.1f} MB for a {small_bytes / 1e6:.0f} MB model, "
          f"{big['grew'] / 1e6:.1f} MB for {big_bytes / 1e6:.0f} MB")
    assert big_bytes - small_bytes > 190e6
    assert not small["jax"] and not big["jax"]
    assert big["grew"] < small["grew"] + 0.1 * (big_bytes - small_bytes)
    assert big["grew"] < 0.2 * big_bytes
