"""CheckpointArrays reads an MoE layer's stored chunk once for all its experts: the export reads every
(layer, expert) of the three expert parameters in turn (hf.tensors' order), which must cost one read of each
parameter's layer, not one per expert (a layer is one storage chunk: each expert's read decodes them all)."""

import numpy as np
from flax import nnx

from stages.train import hf, model
from stages.train.checkpoint_arrays import CheckpointArrays
from stages.train.model_config import ModelConfig
from tests.export import helpers

MOE = ModelConfig(vocab_size=320, d_model=64, n_layers=3, n_heads=4, n_kv_heads=2, head_dim=32, mlp_dim=128,
                  max_seq_len=256, dtype="float32", n_experts=8, n_experts_per_token=2, moe_mlp_dim=48,
                  router_score="softmax", router_norm_topk=True)


class _Counted:
    """A TensorStore array whose reads (of it, or of a slice) are counted in `reads`."""

    def __init__(self, array, reads: list):
        self.array, self.reads = array, reads

    def __getitem__(self, index):
        return _Counted(self.array[index], self.reads)

    def read(self):
        self.reads.append(self.array.shape)
        return self.array.read()


def test_an_moe_layers_experts_cost_one_read_of_its_chunk(tmp_path, monkeypatch):
    params = nnx.split(model.Transformer(MOE, rngs=nnx.Rngs(0)), nnx.Param)[1]
    helpers.write_train(tmp_path / "train", MOE, params)
    arrays = CheckpointArrays(str(tmp_path / "train" / "checkpoint"))
    experts = [t for t in hf.tensors(MOE) if t.index is not None and len(t.index) == 2]
    assert len(experts) == 3 * MOE.n_experts * MOE.n_moe_layers
    whole = {t.param: arrays.read(t.param) for t in experts}      # (L, E, ...) each
    reads: list = []
    store = arrays._array
    monkeypatch.setattr(arrays, "_array", lambda name: _Counted(store(name), reads))
    for t in experts:
        np.testing.assert_array_equal(arrays.read(t.param, t.index), whole[t.param][t.index])
    assert len(reads) == 3 * MOE.n_moe_layers            # each parameter's layer once, not once per expert
    assert {name: layer for name, (layer, _) in arrays._layers.items()} == \
        dict.fromkeys(whole, MOE.n_moe_layers - 1)       # only the last layer of each is held
    np.testing.assert_array_equal(arrays.read("moe_layers.experts_up", 0),
                                  whole["moe_layers.experts_up"][0])     # a layer alone: read as before
