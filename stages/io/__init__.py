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
    safetensors  the safetensors format, written tensor by tensor and read memory-mapped (numpy only)
    figures      matplotlib on its file-only Agg backend, for every report's PNGs
    refusal      `Refusal`: a stage's guard declining at run time, reported in one line without a traceback
    token_ids    the special pieces' fixed ids (unk, bos, eos), which the tokenizer trains with

It imports nothing from `pipeline/` and no stage (an import-linter contract in setup.cfg).
docs/ARCHITECTURE.md's layer diagram lists the same modules; tests/test_docs.py holds both to this directory.
"""
