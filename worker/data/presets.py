"""Default template and verbalizer per packed data set (label words are single WordPiece tokens)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Preset:
    """A template and a verbalizer (index = label id) that suit one data set."""

    template: str
    verbalizer: list[list[str]]


SENTIMENT = Preset("{text} It was [MASK].", [["terrible"], ["great"]])
PAIR = Preset("{text_a} ? [MASK] , {text_b}", [["yes"], ["no"]])

# Label order follows each data set's meta.json "labels".
PRESETS: dict[str, Preset] = {
    "sst2": SENTIMENT,
    "imdb": SENTIMENT,
    # ham, spam ("spam" itself is two WordPieces, spa ##m).
    "enron": Preset("{text} This is [MASK].", [["normal"], ["junk"]]),
    "lingspam": Preset("{text} This is [MASK].", [["normal"], ["junk"]]),
    # not_offensive, offensive
    "offenseval": Preset("{text} It was [MASK].", [["polite"], ["offensive"]]),
    # normal, abusive
    "twitter": Preset("{text} It was [MASK].", [["normal"], ["abusive"]]),
    # entailment, not_entailment
    "qnli": PAIR,
    "rte": PAIR,
}


def preset_for(name: str, task: str = "single") -> Preset:
    """The preset of a packed data set, else a generic one for the task kind."""
    if name in PRESETS:
        return PRESETS[name]
    if task == "pair":
        return PAIR
    raise KeyError(f"no default template/verbalizer for data set {name!r}; pass --template and --verbalizer")
