"""A sentencepiece model as a Hugging Face fast tokenizer (`tokenizer.json`) that gives the same ids.

    spec = tokenizer_json.read_model(open("tokenizer.model", "rb").read())
    tokenizer_json.problem(spec)                  # "" or one line naming a setting the file cannot express
    tokenizer_json.tokenizer_json(spec)           # the dict to write as tokenizer.json

No transformers, no `tokenizers`, no sentencepiece protobuf module (whose generated code needs protobuf 7,
which Beam's pin excludes): the model file is read with a few lines of protobuf wire decoding
(`read_model`), and the JSON is the `tokenizers` library's serialization, written directly.

How each sentencepiece setting is expressed (transformers' own converter does the same for Llama):
    pieces                 the model's vocabulary with the same ids; BPE merges derived from it (every split
                           of a piece into two pieces, ranked by the piece's score, as sentencepiece's BPE
                           encoder merges the best-scoring adjacent pair); unigram keeps the scores
    add_dummy_prefix       normalizers Prepend("▁") then Replace(" ", "▁"), no pre-tokenizer (a Metaspace
                           pre-tokenizer, as transformers' converter writes, skips the prefix when the text
                           already starts with a space; sentencepiece does not)
    byte_fallback          the model's byte_fallback, decoded back by the ByteFallback decoder
    control, unk pieces    special added tokens; user-defined pieces: non-special added tokens
    identity normalization no normalizer; another rule: its precompiled charsmap (`Precompiled`)
Refused with the setting named (`problem`): remove_extra_whitespaces (our tokenizer stage never sets it),
treat_whitespace_as_suffix, escape_whitespaces off, WORD and CHAR models. One difference is left as every
converted Llama tokenizer has it: the literal text "<s>" is the special token to the fast tokenizer and
plain characters to sentencepiece (pass `split_special_tokens=True` to make them agree).
"""

from __future__ import annotations

import base64
import dataclasses
import struct

SPACE = "\u2581"        # sentencepiece's "▁", which stands for a space inside pieces
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
MODEL_TYPES = {1: "unigram", 2: "bpe", 3: "word", 4: "char"}


@dataclasses.dataclass(frozen=True)
class SentencePieceModel:
    """What tokenizer.json needs from a sentencepiece model file."""

    pieces: tuple[tuple[str, float, int], ...]        # (piece, score, type) by id
    model_type: str = "unigram"
    byte_fallback: bool = False
    normalizer: str = ""                               # the rule's name ("identity", "nmt_nfkc", ...)
    charsmap: bytes = b""
    add_dummy_prefix: bool = True
    remove_extra_whitespaces: bool = True
    escape_whitespaces: bool = True
    treat_whitespace_as_suffix: bool = False

    def id_of(self, kind: int) -> int | None:
        return next((i for i, (_, _, t) in enumerate(self.pieces) if t == kind), None)


def read_model(data: bytes) -> SentencePieceModel:
    """Parses a serialized sentencepiece ModelProto (the fields this module uses; defaults as the proto)."""
    pieces, trainer, normalizer = [], {}, {}
    for field, value in _fields(data):
        if field == 1:
            p = dict(_fields(value))
            score = struct.unpack("<f", p[2])[0] if 2 in p else 0.0
            pieces.append((p.get(1, b"").decode(), score, p.get(3, NORMAL)))
        elif field == 2:
            trainer = dict(_fields(value))
        elif field == 3:
            normalizer = dict(_fields(value))
    return SentencePieceModel(
        pieces=tuple(pieces), model_type=MODEL_TYPES.get(trainer.get(3, 1), "unknown"),
        byte_fallback=bool(trainer.get(35, 0)), treat_whitespace_as_suffix=bool(trainer.get(24, 0)),
        normalizer=normalizer.get(1, b"").decode(), charsmap=normalizer.get(2, b""),
        add_dummy_prefix=bool(normalizer.get(3, 1)), remove_extra_whitespaces=bool(normalizer.get(4, 1)),
        escape_whitespaces=bool(normalizer.get(5, 1)))


def problem(m: SentencePieceModel) -> str:
    """Why `m` cannot become a tokenizer.json with identical ids, in one line, or ""."""
    if m.model_type not in ("bpe", "unigram"):
        return f"sentencepiece model_type={m.model_type!r}: only bpe and unigram models are converted"
    for name, bad in (("remove_extra_whitespaces", True), ("treat_whitespace_as_suffix", True),
                      ("escape_whitespaces", False)):
        if getattr(m, name) == bad:
            return (f"sentencepiece {name}={bad}: the fast tokenizer would not give the same ids (Refinery's "
                    f"tokenizer stage trains with remove_extra_whitespaces=False and the defaults otherwise)")
    if m.normalizer not in ("", "identity") and not m.charsmap:
        return f"sentencepiece normalization rule {m.normalizer!r} has no precompiled charsmap to carry over"
    if m.id_of(UNKNOWN) is None:
        return "sentencepiece model has no unknown piece"
    return ""


def tokenizer_json(m: SentencePieceModel, *, bos_id: int | None = None) -> dict:
    """tokenizer.json for `m`; ValueError when `problem(m)`. bos_id: every encoding starts with that piece
    (the export gives the token training put right before every document: the EOS, or BOS with the shard's
    add_bos); None: nothing added. `add_special_tokens=False` encodes without it."""
    if why := problem(m):
        raise ValueError(why)
    unk = m.id_of(UNKNOWN)
    # A one-character user-defined piece (the stage's "\n" without byte fallback) needs nothing: the model
    # has no other way to spell that character. Longer ones are matched whole, as sentencepiece does.
    added = [{"id": i, "content": p, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": t == USER_DEFINED, "special": t != USER_DEFINED}
             for i, (p, _, t) in enumerate(m.pieces)
             if t in (CONTROL, UNKNOWN) or (t == USER_DEFINED and len(p) > 1)]
    if m.model_type == "bpe":
        model = {"type": "BPE", "dropout": None, "unk_token": m.pieces[unk][0],
                 "continuing_subword_prefix": None, "end_of_word_suffix": None, "fuse_unk": True,
                 "byte_fallback": m.byte_fallback, "ignore_merges": False,
                 "vocab": {p: i for i, (p, _, _) in enumerate(m.pieces)}, "merges": bpe_merges(m)}
    else:
        model = {"type": "Unigram", "unk_id": unk, "byte_fallback": m.byte_fallback,
                 "vocab": [[p, s] for p, s, _ in m.pieces]}
    # sentencepiece normalizes (the rule's charsmap), then adds the dummy prefix and escapes spaces, and only
    # then matches user-defined pieces: so those are added tokens matched on the normalized text.
    steps = []
    if m.normalizer not in ("", "identity"):
        steps.append({"type": "Precompiled", "precompiled_charsmap": base64.b64encode(m.charsmap).decode()})
    if m.add_dummy_prefix:
        steps.append({"type": "Prepend", "prepend": SPACE})
    steps.append({"type": "Replace", "pattern": {"String": " "}, "content": SPACE})
    decoders = [{"type": "Replace", "pattern": {"String": SPACE}, "content": " "}]
    if m.byte_fallback:
        decoders.append({"type": "ByteFallback"})
    decoders.append({"type": "Fuse"})
    if m.add_dummy_prefix:
        decoders.append({"type": "Strip", "content": " ", "start": 1, "stop": 0})
    post = None
    if bos_id is not None:      # every encoding starts with the bos piece
        bos = m.pieces[bos_id][0]
        first, a, b = ({"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                       {"Sequence": {"id": "B", "type_id": 1}})
        post = {"type": "TemplateProcessing", "single": [first, a], "pair": [first, a, b],
                "special_tokens": {bos: {"id": bos, "ids": [bos_id], "tokens": [bos]}}}
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
            "normalizer": {"type": "Sequence", "normalizers": steps}, "pre_tokenizer": None,
            "post_processor": post,
            "decoder": {"type": "Sequence", "decoders": decoders}, "model": model}


def bpe_merges(m: SentencePieceModel) -> list[list[str]]:
    """Every (left, right) whose concatenation is a normal or user-defined piece and both halves pieces,
    best-scoring merged piece first: the order in which sentencepiece's BPE encoder would prefer them."""
    ids = {p: i for i, (p, _, t) in enumerate(m.pieces) if t in (NORMAL, USER_DEFINED, BYTE, UNKNOWN)}
    merges = []
    for i, (piece, score, kind) in enumerate(m.pieces):
        if kind not in (NORMAL, USER_DEFINED):
            continue
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in ids and right in ids:
                merges.append((-score, i, ids[left], ids[right], left, right))
    merges.sort()
    return [[left, right] for *_, left, right in merges]


def _fields(data: bytes):
    """(field number, value) of each field of a protobuf message: an int for varints, bytes for
    length-delimited and 32/64-bit fields."""
    i, n = 0, len(data)
    while i < n:
        key, i = _varint(data, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(data, i)
        elif wire == 2:
            size, i = _varint(data, i)
            value, i = data[i:i + size], i + size
        elif wire == 5:
            value, i = data[i:i + 4], i + 4
        elif wire == 1:
            value, i = data[i:i + 8], i + 8
        else:
            raise ValueError(f"sentencepiece model: unsupported protobuf wire type {wire} (field {field})")
        yield field, value


def _varint(data: bytes, i: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        b = data[i]
        i += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, i
        shift += 7
