"""The bottom layer: what the stages and the orchestrator share, and nothing else. Every module here is
read by more than one of them; what only one stage uses lives in that stage (W&B tracking is training's:
stages/train/tracking.py, which pipeline/tracked.py also reads after a run).

    storage      file access for local paths, gs:// and hf:// (the only module that knows URL schemes,
                 and the TensorStore/GCS-emulator settings)
    committed    a finished stage's output as downstream stages read it (`Committed`), and the node names
                 of a tree of sources (`clean[code]`: `stage_of`, `source_of`, `by_source`)
    documents    the document parquet schema that download writes and clean reads and writes
    llmc         the llm.c token shard format: one writer, one reader
    split_rule   which documents are held out (tokenizer) or go to validation (shard)
    safetensors  the safetensors format with numpy only: export writes it, train's init_from reads it
    figures      the reports' figures (clean, evaluate, sweeps): matplotlib on its file-only Agg backend
    refusal      `Refusal`: a stage's guard declining its input or config, one line for the command line

It imports nothing from `pipeline/` and no stage (an import-linter contract in setup.cfg).
"""
