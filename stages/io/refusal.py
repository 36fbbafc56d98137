"""A stage's refusal: its guard declines the input or the config, and the message says why and what to set.

    from stages.io.refusal import Refusal
    raise Refusal("tokenizer.Config.vocab_size=8000 exceeds ...; set tokenizer.Config.allow_large_vocab")

A refusal is an expected end, not a crash: `python -m pipeline` prints its message once, as one `error:` line,
with no traceback (pipeline/tasks.py), the way it prints a mistake found before work. A crash keeps its
traceback. It is a ValueError, so code that catches one still catches it. It lives at the bottom layer because
the stages raise it and the orchestrator reports it.
"""

from __future__ import annotations


class Refusal(ValueError):
    """A stage refuses to go on; the message names the value, why it will not do, and what would."""
