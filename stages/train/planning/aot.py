"""Compile the real train step for a TPU slice that is not here, and read XLA's memory figures for it.

    figures = aot.compile_train_step(train_config)      # train.HardwareConfig.topology = "v5p:8x8x16"
    figures["total"]                                    # bytes per device, from the TPU compiler itself

`jax.experimental.topologies` describes every chip of a TPU topology without a TPU (libtpu, from
`pip install -e '.[tpu]'`, must be installed). The state is built abstractly (shapes and shardings
only: nothing is allocated), the mesh is laid over the topology's devices (train.HardwareConfig.num_slices
copies of it joined over DCN for a multi-slice run, the mesh's dcn_* axes across them), and
`loop.jit_steps` (the function training runs) is lowered and compiled for it. `make plan` prints the
result beside the planner's estimate.
"""

from __future__ import annotations

import os
import re

import jax
import jax.numpy as jnp

from stages.train import loop, native, sharding
from stages.train.planning import hlo
from stages.train.planning.tpu import TPU_GENERATIONS, topology_chips

# What libtpu says when a program does not fit a chip's HBM (two forms, sizes like "362.47G"):
#   Ran out of memory in memory space hbm. Used 120.50G of 95.74G hbm. Exceeded hbm capacity by 24.76G.
#   Ran out of memory on HBM, the total memory required for HLO temporaries (362.47G) exceeds available
#   HBM (95.74G).
_OOM_FORMS = (re.compile(r"Used ([\d.]+[KMGT]?) of ([\d.]+[KMGT]?) hbm"),
              re.compile(r"HLO temporaries \(([\d.]+[KMGT]?)\) exceeds available HBM \(([\d.]+[KMGT]?)\)"))
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


class OutOfMemory(RuntimeError):
    """XLA's compile for the TPU refused the step: it needs more memory than a chip has. `figures` holds
    what libtpu said in `aot.compile_train_step`'s terms: total (bytes per device it needs; for the
    "HLO temporaries" form the temporaries alone, so at least that) and hbm (what it had)."""

    def __init__(self, said: str, needed: int, hbm: int):
        super().__init__(f"XLA's compile ran out of device memory: {said}")
        self.said = said
        self.figures = {"argument": 0, "output": 0, "alias": 0, "temp": needed, "total": needed, "hbm": hbm}


def compile_train_step(cfg, *, eos_id: int = 2, devices: list | None = None,
                       collectives: list | None = None) -> dict[str, int]:
    """XLA's per-device bytes for one train step of `cfg` (a stages.train.Config) on its topology, times
    its num_slices (or on `devices`, such as this machine's simulated CPU devices): argument (params,
    optimizer state, batch), output, alias (outputs that reuse donated arguments), temp (everything else:
    gradients, activations, gathered layers) and total = argument + output - alias + temp. A `collectives`
    list gets the compiled step's collectives (`hlo.collectives`: kind, shapes, group, runs a step)."""
    topology = cfg.hardware.topology
    if devices is None and not topology:
        raise ValueError("train.HardwareConfig.topology is empty: name a TPU topology such as \"v5p:2x2x1\" "
                         "to compile for it")
    devices = devices or _topology_devices(topology, cfg.hardware.num_slices)
    mesh = sharding.make_mesh(cfg.mesh, devices=devices)
    graphdef, tx, init = loop.init_program(cfg.model, cfg.optimizer_for_run(), mesh)
    params, opt_state = jax.eval_shape(init, cfg.seed)     # shapes, dtypes and shardings; nothing allocated
    params_sh, opt_sh = sharding.shardings_of(params), sharding.shardings_of(opt_state)
    step_fn, _ = loop.jit_steps(graphdef, tx, loop.step_options(cfg, eos_id), params_sh, opt_sh, mesh)
    batch = jax.ShapeDtypeStruct((cfg.global_batch, cfg.seq_len + 1), jnp.int32,
                                 sharding=sharding.batch_sharding(mesh))
    with jax.set_mesh(mesh):
        lowered = step_fn.lower(params, opt_state, batch)
        try:
            compiled = lowered.compile()
        except Exception as e:  # noqa: BLE001 - jax's XlaRuntimeError; out of memory is a verdict, not a crash
            if (oom := _out_of_memory(str(e))) is None:
                raise
            raise oom from None
    mem = compiled.memory_analysis()
    figures = {"argument": mem.argument_size_in_bytes, "output": mem.output_size_in_bytes,
               "alias": mem.alias_size_in_bytes, "temp": mem.temp_size_in_bytes}
    figures["total"] = figures["argument"] + figures["output"] - figures["alias"] + figures["temp"]
    if collectives is not None:
        collectives.extend(hlo.collectives(compiled.as_text()))
    return figures


def _out_of_memory(message: str) -> OutOfMemory | None:
    """libtpu's out-of-memory error as an OutOfMemory with its figures, or None for any other error."""
    for form in _OOM_FORMS:
        if found := form.search(message):
            said = next(line.strip() for line in message.splitlines() if "Ran out of memory" in line)
            needed, hbm = (round(float(v.rstrip("KMGT")) * _UNITS[v[-1] if v[-1].isalpha() else ""])
                           for v in found.groups())
            return OutOfMemory(said[:300], needed, hbm)
    return None


def _topology_devices(topology: str, num_slices: int = 1) -> list:
    """The compile-only devices of `num_slices` copies of `topology` joined over DCN, each with its
    `slice_index` (so `sharding.make_mesh` lays the dcn axes across slices)."""
    # Only one process may hold libtpu by default (a lockfile); a compile-only user needs no exclusive
    # access, and tests or a second `make plan` may run beside this one.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    options = {"num_slices": num_slices} if num_slices > 1 else {}
    # A chip of a megacore generation (two TensorCores that run as one device, as JAX gives them on a
    # TPU VM) is one device; libtpu's default for v4 is a device per TensorCore (v4:2x2x4 gave 32).
    if TPU_GENERATIONS.get(topology.partition(":")[0], (None, False))[1]:
        options["chip_config_name"] = "megacore"
    try:
        from jax.experimental import topologies

        with native.stderr_captured() as said:
            desc = topologies.get_topology_desc(platform="tpu", topology_name=topology, **options)
    except Exception as e:  # noqa: BLE001 - libtpu missing or a name it does not know: say which and how
        libtpu = f"; libtpu said: {said()[-2000:]}" if said().strip() else ""
        raise RuntimeError(f"cannot describe TPU topology {topology!r} x {num_slices} slice(s) "
                           f"({type(e).__name__}: {e}); names look like 'v5p:8x8x16' or 'v5e:4x4', and "
                           f"describing one needs libtpu: pip install -e '.[tpu]'{libtpu}") from None
    devices = list(desc.devices)
    expected = topology_chips(topology) * num_slices
    if len(devices) != expected:
        raise RuntimeError(f"topology {topology!r} x {num_slices} slice(s) gave {len(devices)} devices, "
                           f"expected {expected}")
    return devices

