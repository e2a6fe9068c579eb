"""Templates (text → token ids with one mask slot) and verbalizers (label → label-word ids)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from fedprompt.shared.vocab import Family

MASK_SLOT = "[MASK]"
_PIECE = re.compile(r"(\{text\}|\{text_a\}|\{text_b\}|\[MASK\])")


class TemplateError(ValueError):
    """A template or verbalizer that cannot be used with this tokenizer."""


class TextPair(Protocol):
    """What a template reads from an example."""

    text: str
    text_b: str | None


@dataclass(frozen=True)
class _Piece:
    kind: Literal["literal", "slot", "mask"]
    value: str  # literal text, or the slot's field name ("text" / "text_b")
    space_before: bool  # whether a space separated this piece from the one before it in the template


@dataclass
class Encoded:
    """A batch of encoded examples: unpadded token ids and the index of the mask token in each."""

    input_ids: list[list[int]]
    mask_positions: list[int]


def special_affixes(tokenizer: Any) -> tuple[list[int], list[int]]:
    """The special token ids a tokenizer puts before and after a single sequence (BERT: [CLS] / [SEP])."""
    probe = "hello world"
    body = tokenizer(probe, add_special_tokens=False)["input_ids"]
    full = tokenizer(probe, add_special_tokens=True)["input_ids"]
    for start in range(len(full) - len(body) + 1):
        if full[start : start + len(body)] == body:
            return list(full[:start]), list(full[start + len(body) :])
    raise TemplateError(f"cannot tell which special tokens {type(tokenizer).__name__} adds around a sequence")


class Template:
    """A prompt template such as '{text} It was [MASK].' or '{text_a} ? [MASK] , {text_b}'."""

    def __init__(
        self,
        template: str,
        tokenizer: Any,
        max_length: int,
        family: str = Family.MASKED_LM,
    ) -> None:
        # the family decides what stands for [MASK] and where the answer is read (worker/engine/families/)
        from fedprompt.worker.engine.families import adapter

        if template.count(MASK_SLOT) != 1:
            raise TemplateError(f"template must contain exactly one {MASK_SLOT} slot; got {template!r}")
        self.family = family
        self._adapter = adapter(family)
        self.mask_id = self._adapter.mask_id(tokenizer)
        template = self._adapter.template_text(template)
        slots = set(re.findall(r"\{(text|text_a|text_b)\}", template))
        if slots == {"text"}:
            self.task: Literal["single", "pair"] = "single"
        elif slots == {"text_a", "text_b"}:
            self.task = "pair"
        else:
            raise TemplateError(
                f"template must use {{text}} (single sentence) or both {{text_a}} and {{text_b}} (pairs); "
                f"got {template!r}"
            )
        for field in ("text", "text_a", "text_b"):
            if template.count("{" + field + "}") > 1:
                raise TemplateError(f"template uses {{{field}}} more than once: {template!r}")
        self.template = template
        self.tokenizer = tokenizer
        self.max_length = max_length
        self._pieces = self._split(template)
        # Literal pieces never change, so tokenise them once.
        self._literal_ids: dict[int, list[int]] = {
            i: self._tokenize([self._with_space(p)])[0]
            for i, p in enumerate(self._pieces)
            if p.kind == "literal"
        }
        self._prefix, self._suffix = special_affixes(tokenizer)
        self._num_special = len(self._prefix) + len(self._suffix)
        # A literal "[MASK]" inside a user's text must not become a second mask.
        self._mask_substitute = tokenizer.unk_token_id if tokenizer.unk_token_id is not None else 0
        fixed = sum(len(ids) for ids in self._literal_ids.values()) + 1 + self._num_special
        if fixed >= max_length:
            raise TemplateError(
                f"template {template!r} alone takes {fixed} tokens (with special tokens); "
                f"max_length={max_length} leaves no room for the text"
            )
        self._budget = max_length - fixed

    def label_phrase(self, word: str) -> str:
        """The template's own words with its text slots left out and [MASK] replaced by `word`:
        "{text} It was [MASK]." → "It was great." (what mean-pool scoring compares an input with)."""
        out = ""
        for piece in self._pieces:
            if piece.kind != "slot":
                body = word if piece.kind == "mask" else piece.value
                out += (" " if piece.space_before and out else "") + body
        return out

    @staticmethod
    def _split(template: str) -> list[_Piece]:
        pieces: list[_Piece] = []
        space = False
        for part in _PIECE.split(template):
            if not part:
                continue
            if part == MASK_SLOT:
                pieces.append(_Piece("mask", "", space))
                space = False
            elif part.startswith("{"):
                field = "text_b" if part == "{text_b}" else "text"
                pieces.append(_Piece("slot", field, space))
                space = False
            else:
                stripped = part.strip()
                # A leading space only matters after another piece; BPE tokenisers encode it in the next token.
                lead = part[:1].isspace() and bool(pieces)
                if stripped:
                    pieces.append(_Piece("literal", stripped, space or lead))
                space = part[-1:].isspace() or (not stripped and (space or lead))
        return pieces

    def _with_space(self, piece: _Piece, text: str | None = None) -> str:
        body = piece.value if text is None else text
        return (" " + body) if piece.space_before else body

    def _tokenize(self, texts: list[str]) -> list[list[int]]:
        if not texts:
            return []
        return self.tokenizer(texts, add_special_tokens=False)["input_ids"]

    def _fit(self, lengths: list[int]) -> list[int]:
        """Longest-first truncation of the slot lengths so that their sum fits the budget."""
        if sum(lengths) <= self._budget:
            return lengths
        # Find the largest cap c with sum(min(l, c)) <= budget, then hand out what is left one token at a time.
        lo, hi = 0, max(lengths)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if sum(min(n, mid) for n in lengths) <= self._budget:
                lo = mid
            else:
                hi = mid - 1
        capped = [min(n, lo) for n in lengths]
        spare = self._budget - sum(capped)
        for i, n in enumerate(lengths):
            if spare and n > lo:
                capped[i] += 1
                spare -= 1
        return capped

    def encode(self, examples: Sequence[TextPair]) -> Encoded:
        """Token ids (with special tokens, at most max_length) and mask positions for a batch of examples."""
        slot_ids: dict[int, list[list[int]]] = {}
        for i, piece in enumerate(self._pieces):
            if piece.kind != "slot":
                continue
            texts = []
            for ex in examples:
                value = ex.text if piece.value == "text" else ex.text_b
                if value is None:
                    raise TemplateError(f"template {self.template!r} needs text_b, but an example has none")
                texts.append(self._with_space(piece, value.strip()))
            slot_ids[i] = self._tokenize(texts)
        all_ids: list[list[int]] = []
        positions: list[int] = []
        for row in range(len(examples)):
            slot_order = sorted(slot_ids)
            kept = dict(zip(slot_order, self._fit([len(slot_ids[i][row]) for i in slot_order]), strict=True))
            body: list[int] = []
            mask_at = -1
            for i, piece in enumerate(self._pieces):
                if piece.kind == "literal":
                    body.extend(self._literal_ids[i])
                elif piece.kind == "slot":
                    mask_id = self.mask_id
                    body.extend(
                        self._mask_substitute if t == mask_id else t for t in slot_ids[i][row][: kept[i]]
                    )
                else:
                    mask_at = len(body)
                    if self.mask_id is not None:
                        body.append(self.mask_id)
            ids, position = self._adapter.assemble(self._prefix, body, self._suffix, mask_at)
            all_ids.append(ids)
            positions.append(position)
        return Encoded(all_ids, positions)


class Verbalizer:
    """Label words per label; a label's score is the mean of its words' scores."""

    def __init__(self, words: Sequence[Sequence[str]], tokenizer: Any) -> None:
        if len(words) < 2:
            raise TemplateError(f"a verbalizer needs at least two labels; got {len(words)}")
        self.words = [list(ws) for ws in words]
        self.word_ids: list[int] = []
        self.word_label: list[int] = []
        for label, label_words in enumerate(self.words):
            if not label_words:
                raise TemplateError(f"label {label} has no label words")
            for word in label_words:
                self.word_ids.append(self._first_token(word, tokenizer))
                self.word_label.append(label)

    @staticmethod
    def _first_token(word: str, tokenizer: Any) -> int:
        if not word.strip():
            raise TemplateError("label words must not be empty")
        # BPE vocabularies keep a different token for the word after a space, which is how it follows [MASK]
        # in a sentence; WordPiece / SentencePiece give the same ids either way.
        spaced = tokenizer(" " + word.strip(), add_special_tokens=False)["input_ids"]
        if spaced and tokenizer.decode(spaced[:1]).strip():
            return int(spaced[0])
        plain = tokenizer(word.strip(), add_special_tokens=False)["input_ids"]
        if not plain:
            raise TemplateError(f"label word {word!r} encodes to no tokens")
        return int(plain[0])

    @property
    def num_labels(self) -> int:
        """Number of labels."""
        return len(self.words)
