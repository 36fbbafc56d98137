"""`make bench`: runs every benchmark, writes `benchmarks/out/<name>.json` and prints a table.

Each benchmark compares ours against a baseline measured in the same run and reports the ratio;
figures worth keeping go in benchmarks/RESULTS.md with the machine they came from.
"""

from __future__ import annotations

import importlib
import json
import os
import platform
import sys
import tempfile

BENCHMARKS = ("tokenize_throughput", "cached_rerun", "attention", "train_step", "plan_vs_xla",
              "fineweb_filters", "minhash_vs_datatrove", "downstream_scoring", "moe_layer", "step_time",
              "data_scaling", "classifier_scoring", "window_order")
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "out")


def main(names: list[str]) -> int:
    os.makedirs(OUT, exist_ok=True)
    machine = {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version()}
    for name in names or BENCHMARKS:
        module = importlib.import_module(f"benchmarks.{name}")
        with tempfile.TemporaryDirectory() as tmp:
            result = module.measure(tmp) | {"machine": machine}
        path = os.path.join(OUT, f"{name}.json")
        with open(path, "w") as f:
            json.dump(result, f, indent=2, sort_keys=True)
        print(f"\n{name}  ->  {path}")
        for key, value in result.items():
            if key != "machine":
                print(f"  {key:32s} {_short(value)}")
    return 0


def _short(value) -> str:
    """A figure for the table: a dict shows its headline figures only (the JSON has the rest)."""
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict):
        return ", ".join(f"{k}=({_short(v)})" if isinstance(v, dict) else f"{k}={_short(v)}"
                         for k, v in value.items() if isinstance(v, (int, float, str, dict)))
    return str(value)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
