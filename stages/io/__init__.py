"""The bottom layer: what the stages and the orchestrator share, and nothing else.

    storage      file access for local paths, gs:// and hf:// (the only module that knows URL schemes,
                 and the TensorStore/GCS-emulator settings)
    documents    the document parquet schema that download writes and clean reads and writes
    llmc         the llm.c token shard format: one writer, one reader
    split_rule   which documents are held out (tokenizer) or go to validation (shard)
    committed    `Committed`: a stage's committed output, read through its `_SUCCESS.json` manifest
    safetensors  the safetensors format, written tensor by tensor and read memory-mapped (numpy only)
    figures      matplotlib on its file-only Agg backend, for every report's PNGs
    refusal      `Refusal`: a stage's guard declining at run time, reported in one line without a traceback
    tracking     experiment tracking in W&B, one run per trained model (used by train and pipeline/tracked.py)
    wandb_files  W&B's run files read offline: what a killed training's W&B run holds, for its resume
    token_ids    the special pieces' fixed ids (unk, bos, eos), which the tokenizer trains with

It imports nothing from `pipeline/` and no stage (an import-linter contract in setup.cfg).
docs/ARCHITECTURE.md's layer diagram lists the same modules; tests/test_docs.py holds both to this directory.
"""
