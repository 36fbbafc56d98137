"""What each accelerator can hold and do: the one table the planner and MFU read (no JAX).

    devices.get("tpu-v5p").hbm_bytes          # 95 GiB per chip
    devices.for_kind(jax.devices()[0].device_kind)   # the row of a live device ("TPU v5p" -> tpu-v5p)

Figures are per chip (per GPU), from the vendors' published specifications: peak dense bfloat16
matmul FLOP/s (no sparsity), HBM capacity, bidirectional inter-chip bandwidth (TPU ICI, NVIDIA NVLink)
and data-center network bandwidth (between slices or nodes). Host memory is the RAM of the machine
type the chips come in, divided by its chips (Google Cloud: v4 ct4p-hightpu-4t 407 GB / 4, v5e 512 GiB
/ 8, v5p ct5p-hightpu-4t 448 GB / 4, v6e 1536 GiB / 8, H100 a3-highgpu-8g 1872 GB / 8, H200 a3-ultragpu-8g
2952 GB / 8): what remat policies that offload activations (`offload_*`) can fill. "cpu" is a rough
stand-in for the host JAX exposes as one CPU device, so MFU stays finite in CPU runs: read it as an order
of magnitude; its memory is the host's, so it has no separate host memory to offload to (0).
HBM bandwidth (the step-time model's elementwise work, step_time.py) is the vendors': v4 1.2 TB/s,
v5e 819 GB/s, v5p 2.77 TB/s, v6e 1.64 TB/s, H100 SXM 3.35 TB/s, H200 4.8 TB/s. The host link, which
offloaded activations cross, is assumed, not looked up: one PCIe 4.0 x16 link (32 GB/s) a TPU chip, one
5.0 x16 (64 GB/s) an H100 or H200.

ICI (a TPU's inter-chip links) is the bidirectional total over all of a chip's ports, and a collective
drives only the ports its group's sides give it (planning/topology.py), so the step-time model charges
per port and direction: `ici_port_bytes_per_s` = ici_bytes_per_s / (2 x ici_ports). v5p: 1,200 GB/s
bidirectional per chip (Cloud TPU's v5p page, "Bidirectional inter-chip interconnect (ICI) bandwidth per
chip (GBps) 1200"), a 3D torus, so 6 ports: 100 GB/s a port each way. v6e: 800 GB/s bidirectional and
"ICI ports per chip 4" (the v6e page), a 2D torus: 100 GB/s a port each way. v4 (300 GB/s, 6 ports: 25 GB/s)
and v5e (400 GB/s, 4 ports: 50 GB/s) keep this table's totals, not checked again here; their port counts
are their tori's (3D: 2 a side x 3, 2D: 2 x 2). NVLink (a switch, every GPU to every other) has no ports in
this sense (0): a GPU's collectives use its whole NVLink figure.
"""

from __future__ import annotations

import dataclasses
import logging

log = logging.getLogger(__name__)
GiB = 2**30
GB = 10**9


@dataclasses.dataclass(frozen=True)
class Device:
    name: str                  # the key in DEVICES, and what train.HardwareConfig.device names
    label: str                 # how logs and summaries name it (H100 and H200 are the SXM parts)
    hbm_bytes: int             # memory per chip
    peak_flops: float          # dense bfloat16 FLOP/s per chip
    ici_bytes_per_s: float     # bidirectional chip-to-chip bandwidth within a slice (NVLink on GPUs)
    dcn_bytes_per_s: float     # data-center network bandwidth per chip, between slices or nodes
    host_bytes: int            # the host's RAM per chip (0: no memory besides the device's)
    hbm_bytes_per_s: float     # device memory bandwidth
    host_link_bytes_per_s: float   # host to device (PCIe) per chip, what offloaded activations cross
    kinds: tuple[str, ...]     # lower-case substrings of jax's `device_kind` that mean this device
    ici_ports: int = 0         # a TPU chip's ICI ports (2 a side of its torus); 0: a switch (NVLink)

    @property
    def ici_port_bytes_per_s(self) -> float:
        """One ICI port's bandwidth in one direction (the bidirectional total over 2 x ici_ports); a
        switched device (no ports) has its whole figure."""
        return self.ici_bytes_per_s / (2 * self.ici_ports) if self.ici_ports else self.ici_bytes_per_s


DEVICES = {d.name: d for d in (
    Device("tpu-v4", "TPU v4", 32 * GiB, 275e12, 300 * GB, 25e9 / 8, 407 * GB // 4, 1228 * GB, 32 * GB,
           ("tpu v4",), ici_ports=6),
    Device("tpu-v5e", "TPU v5e", 16 * GiB, 197e12, 400 * GB, 25e9 / 8, 64 * GiB, 819 * GB, 32 * GB,
           ("tpu v5 lite", "tpu v5e"), ici_ports=4),
    Device("tpu-v5p", "TPU v5p", 95 * GiB, 459e12, 1200 * GB, 50e9 / 8, 112 * GB, 2765 * GB, 32 * GB,
           ("tpu v5p", "tpu v5"), ici_ports=6),
    Device("tpu-v6e", "TPU v6e", 32 * GiB, 918e12, 800 * GB, 100e9 / 8, 192 * GiB, 1640 * GB, 32 * GB,
           ("tpu v6 lite", "tpu v6e"), ici_ports=4),
    Device("h100", "H100", 80 * GB, 989e12, 900 * GB, 400e9 / 8, 234 * GB, 3350 * GB, 64 * GB, ("h100",)),
    Device("h200", "H200", 141 * GB, 989e12, 900 * GB, 400e9 / 8, 369 * GB, 4800 * GB, 64 * GB, ("h200",)),
    # A few cores with AVX2/AVX-512 FMA reach ~50 GFLOP/s each: 1e11 for a small VM. Memory: what a
    # laptop or CI machine can give one process.
    Device("cpu", "cpu", 16 * GiB, 1e11, 10 * GB, 10e9 / 8, 0, 20 * GB, 0, ("cpu",)),
)}


def get(name: str) -> Device:
    if name not in DEVICES:
        raise ValueError(f"unknown device {name!r}; known devices: {', '.join(DEVICES)}")
    return DEVICES[name]


def for_kind(device_kind) -> Device:
    """The row for a jax device (or its `device_kind` string); unknown kinds fall back to "cpu", warned.

    Kinds are matched most specific first, so "TPU v5 lite" is a v5e and plain "TPU v5" a v5p.
    """
    kind = str(getattr(device_kind, "device_kind", device_kind)).lower()
    matches = [(len(k), d) for d in DEVICES.values() for k in d.kinds if k in kind]
    if matches:
        return max(matches, key=lambda m: m[0])[1]
    log.warning("no figures known for device kind %r (known: %s); using the cpu row", kind,
                ", ".join(DEVICES))
    return DEVICES["cpu"]
