"""The mesh's named axes without JAX (stages/train/mesh.py): the sizes a MeshConfig resolves to, read by
name, and the guard that no module indexes a mesh by an axis name outside the `Mesh` class."""

import os
import re

import pytest

from stages.train.mesh import AXES, Mesh, MeshConfig, mesh_axes
from tests.conftest import REPO


def test_a_mesh_config_resolves_to_the_whole_mesh_read_by_name():
    mesh = MeshConfig(fsdp=64, expert=16).for_devices(1024)
    assert mesh == Mesh(data=1, fsdp=64, expert=16, tensor=1)
    assert mesh.items() == (("data", 1), ("fsdp", 64), ("expert", 16), ("tensor", 1))
    assert mesh.shape == (1, 64, 16, 1) and tuple(a for a, _ in mesh.items()) == AXES
    assert mesh.devices == 1024 and mesh.batch_shards == 1024 and mesh.embed_shards == 1024
    assert mesh.describe() == "data 1 x fsdp 64 x expert 16 x tensor 1"
    assert mesh.describe_batch() == "data x fsdp x expert"
    # Two slices of 4 chips, data across them: each axis is its size within a slice x the slices it spans.
    two = MeshConfig(fsdp=2, tensor=2, dcn_data=2).for_devices(8)
    assert two == Mesh(data=2, fsdp=2, tensor=2) and two.describe() == "data 2 x fsdp 2 x tensor 2"
    assert two.batch_shards == 4 and two.describe_batch() == "data x fsdp"
    with pytest.raises(ValueError, match="does not match the 8 devices"):
        MeshConfig(fsdp=3).for_devices(8)


def test_axes_named_by_a_rule_are_read_through_the_mesh_and_a_wrong_name_says_which_exist():
    mesh = Mesh(data=2, fsdp=4, tensor=8)
    assert mesh.size("tensor") == 8 and mesh.product(("fsdp", "expert")) == 4
    assert mesh.without(("fsdp", "expert")) == Mesh(data=2, tensor=8) and mesh.without(()) is mesh
    assert mesh_axes(("embed", "kv_heads"), (64, 4), mesh) == (("fsdp", "expert"), ())   # 4 % 8 != 0
    with pytest.raises(ValueError, match=r"mesh axis 'model' is not one of \('data', 'fsdp', 'expert'"):
        mesh.size("model")
    with pytest.raises(ValueError, match="mesh axis 'model'"):
        mesh.without(("model",))
    with pytest.raises(ValueError, match=r"Mesh.tensor=0 must be >= 1"):
        Mesh(tensor=0)
    with pytest.raises(ValueError, match="a size for each of"):
        Mesh.from_shape((1, 2, 3))


def test_no_module_indexes_a_mesh_by_an_axis_name():
    """The axes are the Mesh's fields: a size is `mesh.fsdp`, or `mesh.size(axis)` for a name a rule or a
    collective gives; never `mesh["fsdp"]` (a dict mesh, or a jax mesh's shape read by key)."""
    indexed = re.compile(r"\[[\"'](data|fsdp|expert|tensor)[\"']\]")
    found = []
    for package in ("stages", "pipeline", "benchmarks"):
        for folder, _, files in os.walk(os.path.join(REPO, package)):
            for name in (f for f in files if f.endswith(".py")):
                path = os.path.join(folder, name)
                with open(path, encoding="utf-8") as f:
                    found += [f"{os.path.relpath(path, REPO)}:{i}: {line.strip()}"
                              for i, line in enumerate(f, 1) if indexed.search(line)]
    assert not found, "\n".join(found)
