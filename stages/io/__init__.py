"""The bottom layer: what every stage and the orchestrator share, and nothing else.

    storage      file access for local paths, gs:// and hf:// (the only module that knows URL schemes,
                 and the TensorStore/GCS-emulator settings)
    documents    the document parquet schema that download writes and clean reads and writes
    llmc         the llm.c token shard format: one writer, one reader
    split_rule   which documents are held out (tokenizer) or go to validation (shard)
    token_ids    the special pieces' fixed ids (unk, bos, eos), which the tokenizer trains with

It imports nothing from `pipeline/` and no stage (an import-linter contract in setup.cfg).
"""
