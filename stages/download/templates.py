"""Instruction-tuning records rendered to one `text`, so supervised data flows through the same stages.

    download.Files.template = "alpaca"   # or "chatml", or a format string over {instruction} {input} {output}
    render(Template.named("chatml"), {"messages": [{"role": "user", "content": "Hi"}, ...]})

A record is either an instruction record, `{"instruction", "input" (optional), "output"}`, or a chat record,
`{"messages": [{"role", "content"}, ...]}` (a record with `messages` is a chat record). A template says how
each becomes text:

    alpaca   Stanford Alpaca's prompt (its no-input variant when `input` is absent or empty); a chat's
             messages as "### Instruction:" (user), "### Response:" (assistant) and plain (system) blocks
    chatml   every message as `<|im_start|>{role}\\n{content}<|im_end|>\\n`; an instruction record as the
             chat [user: instruction, then input after a blank line; assistant: output]
    custom   any other string is a format string over {instruction} {input} {output}; chats then need
             `message_formats`, a format over {role} {content} per role ("*" for any other role)

`message_formats` also overrides a named template's per-role formats. A record that cannot be rendered
gets a reason (`document.py`) instead of text: missing_instruction, missing_output, non_string_field,
malformed_messages, unknown_role. Standard library only: planning imports this to check the gin values.
"""

from __future__ import annotations

import dataclasses
import string
from collections.abc import Mapping
from typing import Any

INSTRUCTION_FIELDS = ("instruction", "input", "output")
MESSAGES = "messages"
ANY_ROLE = "*"

_ALPACA_INTRO = "Below is an instruction that describes a task"
ALPACA = (_ALPACA_INTRO + ", paired with an input that provides further context. Write a response that "
          "appropriately completes the request.\n\n### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n"
          "### Response:\n{output}")
ALPACA_NO_INPUT = (_ALPACA_INTRO + ". Write a response that appropriately completes the request.\n\n"
                   "### Instruction:\n{instruction}\n\n### Response:\n{output}")
CHATML_MESSAGE = "<|im_start|>{role}\n{content}<|im_end|>\n"


@dataclasses.dataclass(frozen=True)
class Template:
    prompt: str = ""                               # an instruction record; "" = as the chat below
    prompt_no_input: str = ""                      # the same when `input` is absent or empty; "" = prompt
    roles: tuple[tuple[str, str], ...] = ()        # (role, format over {role} {content}) for chat records

    @staticmethod
    def named(name: str, message_formats: Mapping[str, str] | tuple = ()) -> Template:
        """The template `name` (a NAMES key, or a custom format string), its role formats overridden by
        `message_formats`; ValueError naming the valid choices for anything else."""
        overrides = dict(message_formats)
        for role, fmt in overrides.items():
            _check_format(fmt, ("role", "content"), f"message_formats[{role!r}]")
        if name in NAMED:
            base = NAMED[name]
        else:
            _check_format(name, INSTRUCTION_FIELDS, "template", custom=True)
            base = Template(prompt=name)
        return dataclasses.replace(base, roles=tuple(sorted({**dict(base.roles), **overrides}.items())))


NAMED = {
    "alpaca": Template(ALPACA, ALPACA_NO_INPUT, (("assistant", "### Response:\n{content}\n\n"),
                                                 ("system", "{content}\n\n"),
                                                 ("user", "### Instruction:\n{content}\n\n"))),
    "chatml": Template("", "", ((ANY_ROLE, CHATML_MESSAGE),)),
}
NAMES = tuple(NAMED)


def render(template: Template, record: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """(text, None), or (None, the reason the record cannot be rendered)."""
    if record.get(MESSAGES) is not None:
        return _chat(template, record[MESSAGES])
    if record.get("instruction") is None:
        return None, "missing_instruction"
    if record.get("output") is None:
        return None, "missing_output"
    values = {name: record.get(name) if record.get(name) is not None else "" for name in INSTRUCTION_FIELDS}
    if not all(isinstance(v, str) for v in values.values()):
        return None, "non_string_field"
    if not template.prompt:   # a chat template: the record as a two-turn chat
        user = values["instruction"] + (f"\n\n{values['input']}" if values["input"] else "")
        return _chat(template, [{"role": "user", "content": user},
                                {"role": "assistant", "content": values["output"]}])
    prompt = template.prompt_no_input if template.prompt_no_input and not values["input"] else template.prompt
    return prompt.format(**values), None


def _chat(template: Template, messages: Any) -> tuple[str | None, str | None]:
    if not isinstance(messages, list) or not messages:
        return None, "malformed_messages"
    formats = dict(template.roles)
    parts = []
    for m in messages:
        if not (isinstance(m, Mapping) and isinstance(m.get("role"), str)
                and isinstance(m.get("content"), str)):
            return None, "malformed_messages"
        fmt = formats.get(m["role"], formats.get(ANY_ROLE))
        if fmt is None:
            return None, "unknown_role"
        parts.append(fmt.format(role=m["role"], content=m["content"]))
    return "".join(parts), None


def _check_format(fmt: Any, allowed: tuple[str, ...], what: str, custom: bool = False) -> None:
    names = ", ".join("{" + a + "}" for a in allowed)
    valid = (f"one of {', '.join(repr(n) for n in NAMED)}, or a format string over {names}" if custom
             else f"a format string over {names}")
    if not isinstance(fmt, str) or not fmt:
        raise ValueError(f"{what}={fmt!r} is not {valid}")
    try:
        used = {name for _, name, _, _ in string.Formatter().parse(fmt) if name is not None}
    except ValueError as e:   # an unmatched brace
        raise ValueError(f"{what}={fmt!r} is not {valid}: {e} "
                         "(write a literal brace as {{ or }})") from None
    if not used or not used <= set(allowed):
        raise ValueError(f"{what}={fmt!r} is not {valid}"
                         + (f"; it uses {sorted(used - set(allowed))}" if used - set(allowed) else ""))
