"""Planning: will a training config fit its hardware, and how long will it take? Answered from the config
alone, without JAX (but aot.py), so `make plan` runs in a second and training refuses a config that cannot
fit before anything compiles.

    make plan GIN=gin/600b.gin            # planner.plan(config).render(); DAYS=30: search.smallest_slice
    from stages.train.planning import planner, search

Training reads two of its modules: hardware.py (`train.HardwareConfig`, where the run is meant to train,
which `train.Config` holds) and devices.py (each chip's figures, for MFU). planner.py's docstring maps the
rest.
"""
