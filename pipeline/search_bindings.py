"""The gin configurables of the commands that run many plans: `sweep.*` (pipeline/sweep.py) and `mixsearch.*`
(pipeline/mixsearch.py). They live here, imported by pipeline/config.py, so that every command and test that
loads a sweep or mixsearch file knows them (`make plan GIN=gin/sweeps/lr.gin` plans its base run), while the
modules that use them load only where they run."""

import gin

MEAN_BPB = "bpb/mean"          # the mean of every reference set's bits per byte (mixsearch's default target)


@gin.configurable("sweep")
def sweep(variants=gin.REQUIRED, seeds=1, cumulative=False):
    return variants, seeds, cumulative


@gin.configurable("mixsearch")
def mixsearch(proxies=8, seed=0, alpha=1.0, target=MEAN_BPB, seeds=2):
    return proxies, seed, alpha, target, seeds
