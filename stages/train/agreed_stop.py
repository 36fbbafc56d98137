"""One decision to stop, taken alike by every process of a training run.

    agreed = AgreedStop(request, mesh, process_count)   # request: stop.stop_requests()'s StopRequest
    for step in ...:
        params, opt_state, out = step_fn(params, opt_state, batch)
        agreed.cast(step)                   # right after dispatching `step`
        ...                                 # wait for step - 1 (loop.MAX_IN_FLIGHT)
        if agreed.asked(step):              # the same answer on every process
            ...                             # save the checkpoint of step + 1, raise TrainingStopped

A signal reaches the hosts of a slice at slightly different moments (or only one of them: a preempted
host, a Ctrl-C in one terminal). Were each to act on its own request, they would stop after different
steps, and their shared checkpoint, which every process must write, would never complete. So with N
processes each one contributes its request (the signal's number, 0 for none) to a tiny collective, the
maximum over the processes, dispatched right behind step s; after step s + 1 every process reads that
maximum, which is the same everywhere, and all stop after step s + 1 when any of them had been asked
before dispatching step s. The host already waits for step s while step s + 1 runs (MAX_IN_FLIGHT), so
reading the vote adds no wait and the device stays busy; a stop is acted on within about one step more
than a single process needs. A single process casts nothing and reads its own request: no collective.

JAX's preemption sync manager (`multihost_utils.reached_preemption_sync_point`) was not used: it hears
only SIGTERM, through a C++ handler that Python's `signal.signal` (which Ctrl-C needs) replaces.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from stages.train import sharding
from stages.train.stop import REASONS, StopRequest


class AgreedStop:
    """Whether to stop after a step, the same on every process; `reason` says who asked and why."""

    def __init__(self, request: StopRequest, mesh: jax.sharding.Mesh, process_count: int):
        self.request, self.reason = request, ""
        self._votes: dict[int, jax.Array] = {}          # step -> max signal number over processes, ()
        self._multi = process_count > 1
        if self._multi:
            self._flags = NamedSharding(mesh, PartitionSpec(tuple(mesh.axis_names)))   # one per device
            self._max = jax.jit(jnp.max, out_shardings=sharding.replicated(mesh))

    def cast(self, step: int) -> None:
        """Each process's request as it stands after dispatching `step` (a collective: every process
        calls this after every step, in the same order as the steps)."""
        if not self._multi:
            return
        signum = (self.request.signum or 0) if self.request.is_set() else 0
        local = np.full((len(self._flags.addressable_devices),), signum, np.int32)
        self._votes[step] = self._max(jax.make_array_from_process_local_data(self._flags, local))

    def asked(self, step: int) -> bool:
        """After `step`: whether to stop now. With N processes, the vote cast after step - 1 (none for
        the first step a run takes: it goes on)."""
        if not self._multi:
            if self.request.is_set():
                self.reason = self.request.reason
            return self.request.is_set()
        vote = self._votes.pop(step - 1, None)
        for old in [s for s in self._votes if s < step - 1]:   # a step the loop skipped: never read
            del self._votes[old]
        signum = 0 if vote is None else int(np.asarray(vote.addressable_data(0)))
        if signum:
            here = self.request.is_set() and self.request.signum == signum
            self.reason = REASONS[signum] + ("" if here else " on another process")
        return bool(signum)
