"""The work of each pipeline stage. Nothing here knows about Luigi or gin.

Every stage module exposes `Config` (a frozen dataclass), `VERSION` and
`run(config, inputs, out_dir)`, where `inputs` maps upstream stage names to
`pipeline.cache.Committed` and `out_dir` is a fresh attempt directory (local or gs://).
"""
