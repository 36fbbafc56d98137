"""The fixed ids of the special pieces: what the tokenizer stage asks sentencepiece for, and what a stage
that writes token ids without reading them from a tokenizer uses (the yardsticks stage starts every task's
text with EOS_ID, as a document in the shards starts after one).

    from stages.io.token_ids import EOS_ID

unk, bos, eos are pieces 0, 1, 2 (Llama's layout); there is no pad piece (-1): shards pack documents with no
padding, and a loss mask covers any padding the trainer adds. They live here, in the layer every stage may
import, so that no stage imports the tokenizer stage for an integer.
"""

UNK_ID, BOS_ID, EOS_ID, PAD_ID = 0, 1, 2, -1
