"""Default template and verbalizer per packed data set (label words are single WordPiece tokens), and the
generic templates one's own data gets (its label words come from its label names: worker/data/verbalizer.py)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Preset:
    """A template and a verbalizer (index = label id) that suit one data set with these labels."""

    template: str
    verbalizer: list[list[str]]
    labels: tuple[str, ...] | None = None


SINGLE_TEMPLATE = "{text} It was [MASK]."
PAIR_TEMPLATE = "{text_a} ? [MASK] , {text_b}"
SENTIMENT = Preset(SINGLE_TEMPLATE, [["terrible"], ["great"]], ("negative", "positive"))
PAIR = Preset(PAIR_TEMPLATE, [["yes"], ["no"]], ("entailment", "not_entailment"))
SPAM = Preset("{text} This is [MASK].", [["normal"], ["junk"]], ("ham", "spam"))

# Label order follows each data set's meta.json "labels".
PRESETS: dict[str, Preset] = {
    "sst2": SENTIMENT,
    "imdb": SENTIMENT,
    # ham, spam ("spam" itself is two WordPieces, spa ##m).
    "enron": SPAM,
    "lingspam": SPAM,
    "offenseval": Preset(SINGLE_TEMPLATE, [["polite"], ["offensive"]], ("not_offensive", "offensive")),
    "twitter": Preset(SINGLE_TEMPLATE, [["normal"], ["abusive"]], ("normal", "abusive")),
    "qnli": PAIR,
    "rte": PAIR,
}


def generic_template(task: str = "single") -> str:
    """The template of one's own data: a sentence with [MASK] after the text, or the pair template."""
    return PAIR_TEMPLATE if task == "pair" else SINGLE_TEMPLATE


def preset_for(
    name: str, task: str = "single", labels: list[str] | tuple[str, ...] | None = None
) -> Preset | None:
    """The preset of a packed data set of this name (and, when given, these labels and task), else None."""
    preset = PRESETS.get(name)
    if preset is None or ("{text_a}" in preset.template) != (task == "pair"):
        return None
    if labels is not None and preset.labels is not None and tuple(labels) != preset.labels:
        return None
    return preset
