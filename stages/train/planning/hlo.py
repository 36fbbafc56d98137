"""The collectives a compiled step runs, read from its optimized HLO text (no JAX): kind, shapes, replica
group size and how many times a step each runs (loop trip counts multiplied through), so the step-time
model's bytes can be checked against, and printed beside, what XLA actually moves.

    cs = hlo.collectives(compiled.as_text())       # [Collective(kind, shapes, group, count, op), ...]
    hlo.bytes_by_kind(cs)                          # {"all-gather": bytes a device a step, ...}

Kinds: "all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute". The TPU compiler
writes a reduce-scatter as an all-reduce inside a fusion it calls "all-reduce-scatter"; those count as
"reduce-scatter". Bytes are each collective's whole array: what an all-gather produces, what an all-reduce
or a reduce-scatter reduces (before the scatter), what an all-to-all exchanges; an async pair counts once
(its -done). A while loop's body runs its trip count (the bound its condition compares the counter with:
scans count from 0), so a layer scan's collectives count once a layer.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import re

DTYPE_BYTES = {"bf16": 2, "f16": 2, "f32": 4, "f64": 8, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "s32": 4,
               "u32": 4, "s64": 8, "u64": 8, "pred": 1}
KINDS = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")
_ARRAY = re.compile(r"\b(" + "|".join(DTYPE_BYTES) + r")\[([0-9,]*)\]")
_HEADER = re.compile(r"^(ENTRY )?%?([\w.\-]+) \(.*\{$")
_INSTRUCTION = re.compile(r"^\s+(ROOT )?%[\w.\-]+ = ")
_COLLECTIVE = re.compile(r"^\s+(?:ROOT )?%[\w.\-]+ = (.*?) (all-gather|all-reduce|reduce-scatter|all-to-all|"
                         r"collective-permute)(-start|-done)?\(")


@dataclasses.dataclass(frozen=True)
class Collective:
    kind: str                                         # one of KINDS
    shapes: tuple[tuple[str, tuple[int, ...]], ...]  # (dtype, dims) of each array it moves
    group: int                                        # devices in each replica group
    count: int                                        # times it runs a step
    op: str                                           # the jax op it came from (metadata op_name)

    @property
    def bytes(self) -> int:
        """Bytes of its arrays, one execution."""
        return sum(DTYPE_BYTES[d] * math.prod(dims) for d, dims in self.shapes)


def collectives(text: str) -> list[Collective]:
    """Every collective of an optimized HLO module's text that runs (count > 0), in text order."""
    comps, entry = _computations(text)
    runs = _runs(comps, entry)
    scatter = {c for c in comps if c.startswith("all-reduce-scatter")}
    out = []
    starts = {}                              # an async pair's -start name -> its replica group size
    for lines in comps.values():
        for line in lines:
            if (m := _COLLECTIVE.match(line)) and m.group(3) == "-start":
                starts[re.match(r"\s*(?:ROOT )?%([\w.\-]+)", line).group(1)] = _group(line)
    for name, lines in comps.items():
        for line in lines:
            m = _COLLECTIVE.match(line)
            if not m or m.group(3) == "-start" or not runs[name]:
                continue
            kind = "reduce-scatter" if m.group(2) == "all-reduce" and name in scatter else m.group(2)
            shapes = tuple((d, tuple(int(n) for n in dims.split(",") if n)) for d, dims in
                           _ARRAY.findall(m.group(1)))
            op = re.search(r'op_name="([^"]+)"', line)
            group = _group(line)
            if m.group(3) == "-done" and (start := re.search(r"-done\(%([\w.\-]+)\)", line)):
                group = starts.get(start.group(1), group)
            out.append(Collective(kind, shapes, group, runs[name], op.group(1) if op else ""))
    return out


def bytes_by_kind(cs: list[Collective]) -> dict[str, int]:
    """{kind: bytes a device a step} over `cs`, every kind of KINDS present (0 where none ran)."""
    out = dict.fromkeys(KINDS, 0)
    for c in cs:
        out[c.kind] += c.bytes * c.count
    return out


def _computations(text: str) -> tuple[dict[str, list[str]], str]:
    """{computation: its instructions (a multi-line instruction joined)}, and the ENTRY computation."""
    comps: dict[str, list[str]] = {}
    current, entry = None, ""
    for line in text.splitlines():
        if current is None:
            if m := _HEADER.match(line):
                current = m.group(2)
                comps[current] = []
                entry = current if m.group(1) else entry
        elif line.rstrip() == "}" or line.startswith("}, execution_thread="):
            current = None
        elif _INSTRUCTION.match(line) or not comps[current]:
            comps[current].append(line)
        else:
            comps[current][-1] += line
    if not entry:
        raise ValueError("no ENTRY computation in the HLO text: pass compiled.as_text() of a jitted function")
    return comps, entry


def _runs(comps: dict[str, list[str]], entry: str) -> collections.Counter:
    """How many times each computation runs per execution of `entry`: a while body its trip count times
    its caller's, anything else called (fusions, calls, branches, reducers) its caller's."""
    runs = collections.Counter({entry: 1})
    order, seen = [entry], {entry}
    for name in order:                                   # callers before callees: HLO has no recursion
        for line in comps.get(name, ()):
            callees = []
            if body := re.search(r"body=%([\w.\-]+)", line):
                cond = re.search(r"condition=%([\w.\-]+)", line)
                callees.append((body.group(1), _trip_count(comps, cond.group(1) if cond else "")))
            for key in ("calls", "to_apply"):
                callees += [(c, 1) for c in re.findall(key + r"=%([\w.\-]+)", line)]
            for group in re.findall(r"branch_computations=\{([^}]*)\}", line):
                callees += [(c, 1) for c in re.findall(r"%([\w.\-]+)", group)]
            for callee, times in callees:
                runs[callee] += runs[name] * times
                if callee not in seen:
                    seen.add(callee)
                    order.append(callee)
    return runs


def _trip_count(comps, condition: str) -> int:
    """The bound a scan's loop condition compares its counter with (the one constant it holds)."""
    for line in comps.get(condition, []):
        if m := re.search(r"constant\((\d+)\)", line):
            return int(m.group(1))
    return 1


def _group(line: str) -> int:
    """Devices in each replica group: mesh['a'=4,'b'=2] {'a'} -> 4, {{0,1},{2,3}} -> 2, [2,4]<=[8] -> 4."""
    if m := re.search(r"replica_groups=mesh\[([^\]]*)\] \{([^}]*)\}", line):
        sizes = dict(re.findall(r"'(\w+)'=(\d+)", m.group(1)))
        return math.prod(int(sizes[a]) for a in re.findall(r"'(\w+)'", m.group(2)))
    if m := re.search(r"replica_groups=\{\{([^}]*)\}", line):
        return len(m.group(1).split(","))
    if m := re.search(r"replica_groups=\[([0-9,]+)\]<=", line):
        return int(m.group(1).split(",")[-1])
    return 1
