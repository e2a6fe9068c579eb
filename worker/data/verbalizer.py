"""Label words: the --verbalizer syntax every command takes, the one-word-piece rule, and the defaults of
one's own data (the template of its task, its label names as label words).

A label is scored by the model's score of its label words' first word piece at [MASK], so a label word
must be ONE word piece of the model's vocabulary: with `spam` (WordPiece: spa ##m) only `spa` would be
read. Defaults and given verbalizers are checked against the model's tokenizer before anything starts.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from fedprompt.worker.data.dataset import DataError
from fedprompt.worker.data.presets import generic_template, preset_for

VERBALIZER_HELP = (
    "Label words in label id order: 'terrible;great' (labels by ';', several words of one label by ',', "
    'e.g. \'bad,awful;good\') or JSON [["bad","awful"],["good"]]; each word ONE word piece of the '
    "model's vocabulary. Default: the packed set's, else the label names."
)

# Single-piece stand-ins for label names that are several word pieces (or not words) in common vocabularies.
SYNONYMS: dict[str, list[str]] = {
    "spam": ["junk", "ads"],
    "ham": ["normal", "mail"],
    "not_spam": ["normal"],
    "not_offensive": ["polite", "fine"],
    "non_offensive": ["polite", "fine"],
    "offensive": ["offensive", "rude"],
    "abusive": ["abusive", "rude"],
    "entailment": ["yes"],
    "not_entailment": ["no"],
    "contradiction": ["no"],
    "neutral": ["maybe", "neutral"],
    "negative": ["bad", "terrible"],
    "positive": ["good", "great"],
    "toxic": ["toxic", "rude"],
    "non_toxic": ["fine", "polite"],
    "hateful": ["hate", "hateful"],
}


class LabelWordError(DataError):
    """A label word that is several word pieces, or labels without names to take words from."""


def parse_verbalizer(text: str) -> list[list[str]]:
    """'terrible;great', 'bad,awful;good,great' (labels by ';', words by ',') or a JSON list of lists."""
    text = text.strip()
    if text.startswith("["):
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DataError(f'--verbalizer is not valid JSON ({exc.msg}); e.g. [["bad"], ["good"]]') from None
        if not isinstance(value, list) or not all(
            isinstance(words, list) and words and all(isinstance(w, str) and w.strip() for w in words)
            for words in value
        ):
            raise DataError('--verbalizer JSON must be a list of lists of words, e.g. [["bad"], ["good"]]')
        words = [[w.strip() for w in ws] for ws in value]
    else:
        words = [[w.strip() for w in part.split(",") if w.strip()] for part in text.split(";")]
    if len(words) < 2 or any(not ws for ws in words):
        raise DataError(
            f"--verbalizer {text!r}: give words for at least two labels, e.g. 'terrible;great' or "
            '[["bad"], ["good"]]'
        )
    return words


def load_tokenizer(model: str) -> Any:
    """The tokenizer of a hub id or local path ('all-MiniLM-L6-v2' is the offline default)."""
    from fedprompt.worker.engine.offline import resolve_model
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(resolve_model(model))
    except (OSError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DataError(f"cannot load the tokenizer of --model {model!r}: {first}") from None


def word_pieces(word: str, tokenizer: Any) -> list[str]:
    """The word pieces of a label word as it follows [MASK] in a sentence (after a space), the way the
    engine's verbalizer reads it."""
    word = word.strip()
    spaced = tokenizer(" " + word, add_special_tokens=False)["input_ids"]
    if spaced and tokenizer.decode(spaced[:1]).strip():
        ids = spaced
    else:
        # a SentencePiece word after a space can start with a bare '▁' piece: the engine reads it unspaced
        ids = tokenizer(word, add_special_tokens=False)["input_ids"]
    return [str(t) for t in tokenizer.convert_ids_to_tokens(ids)]


def is_one_piece(word: str, tokenizer: Any) -> bool:
    """True when the word is a single word piece of the tokenizer's vocabulary."""
    return bool(word.strip()) and len(word_pieces(word, tokenizer)) == 1


def _suggestion(label_names: Sequence[str], tokenizer: Any) -> str:
    """An example --verbalizer value of single-piece words for these labels."""
    words: list[str] = []
    for name in label_names:
        key = name.strip().lower().replace("-", "_").replace(" ", "_")
        options = [*SYNONYMS.get(key, []), name]
        words.append(next((w for w in options if is_one_piece(w, tokenizer)), f"WORD{len(words) + 1}"))
    return ";".join(words)


def check_label_words(
    words: Sequence[Sequence[str]], label_names: Sequence[str], tokenizer: Any, model: str
) -> None:
    """Refuse a verbalizer with the wrong number of labels or a label word of several word pieces."""
    if len(words) != len(label_names):
        raise LabelWordError(
            f"--verbalizer has words for {len(words)} labels; the data has {len(label_names)} "
            f"({', '.join(label_names)})"
        )
    for name, label_words in zip(label_names, words, strict=True):
        for word in label_words:
            pieces = word_pieces(word, tokenizer)
            if len(pieces) != 1:
                raise LabelWordError(
                    f"label word {word!r} of label {name!r} is {len(pieces)} word pieces of {model}'s "
                    f"vocabulary ({' '.join(pieces)}); only its first would be read: choose single-piece "
                    f"words, e.g. --verbalizer '{_suggestion(label_names, tokenizer)}'"
                )


def default_verbalizer(label_names: Sequence[str], tokenizer: Any, model: str) -> list[list[str]]:
    """The label names as label words, when each is one word piece; else an error naming the label, its
    pieces, and single-piece words to pass instead."""
    if all(name.strip().lstrip("-").isdigit() for name in label_names):
        raise LabelWordError(
            f"the labels have no names (ids {', '.join(label_names)}), so there are no label words to "
            "take from them: name them with --labels (in id order, e.g. --labels negative,positive) or "
            "pass --verbalizer (e.g. --verbalizer 'terrible;great')"
        )
    for name in label_names:
        pieces = word_pieces(name, tokenizer)
        if len(pieces) != 1:
            raise LabelWordError(
                f"label {name!r} is {len(pieces)} word pieces of {model}'s vocabulary ({' '.join(pieces)}) "
                "and a label word must be one: pass --verbalizer with single-piece words in label order "
                f"({', '.join(label_names)}), e.g. --verbalizer '{_suggestion(label_names, tokenizer)}'"
            )
    return [[name.strip()] for name in label_names]


def choose_prompt(
    *,
    name: str,
    task: str,
    label_names: Sequence[str],
    template: str | None,
    verbalizer: str | Sequence[Sequence[str]] | None,
    tokenizer: Any,
    model: str,
) -> tuple[str, list[list[str]]]:
    """(template, verbalizer) of a run: what was given, else a packed data set's preset, else the generic
    template of the task and the label names as label words; every label word checked against the model."""
    preset = preset_for(name, task, list(label_names))
    chosen_template = template or (preset.template if preset else generic_template(task))
    if verbalizer is not None:
        words = parse_verbalizer(verbalizer) if isinstance(verbalizer, str) else [list(w) for w in verbalizer]
    elif preset is not None:
        words = [list(w) for w in preset.verbalizer]
    else:
        words = default_verbalizer(label_names, tokenizer, model)
    check_label_words(words, label_names, tokenizer, model)
    return chosen_template, words
