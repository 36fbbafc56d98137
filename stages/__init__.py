"""The work of each pipeline stage. Nothing here knows about Luigi, gin or the cache layout.

Every stage module exposes `Config` (a frozen dataclass), `VERSION` and
`run(config, inputs, out_dir, work_dir)`, where `inputs` maps upstream stage names to their
committed outputs (`stages.io.committed.Committed`, what `pipeline.cache.load` returns:
`.file(name)`, `.paths(pattern)`), `out_dir` is a fresh attempt directory (local or on GCS) and
`work_dir` is scratch space that survives a failed attempt of the same key (training resumes from
checkpoints there; the other stages ignore it).

`stages/io/` is the bottom layer every stage and the orchestrator share. Stages never import
`pipeline/`, and import of the other stages only those whose output they read; the import contracts in
setup.cfg (one per stage, derived from pipeline/dag.py) say so, and which heavy libraries each may reach.
"""
