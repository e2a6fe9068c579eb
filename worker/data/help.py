"""The help of the data options every command shares (`fedprompt simulate`, `fedprompt-worker serve` and
`train-local`, `fedprompt data import`): one wording, so the flags read the same everywhere."""

from fedprompt.worker.data.verbalizer import VERBALIZER_HELP

DATA_HELP = (
    "A packed data set name (looked up in $FEDPROMPT_DATASETS, then in the folder `fedprompt data fetch` "
    "and `import` write to), a packed data set folder, or a CSV/TSV/JSONL(.gz) file."
)
TEST_DATA_HELP = (
    "A CSV/TSV/JSONL test file with the same columns (default: the packed set's test split; for a file, a "
    "seeded 10 % held out)."
)
TEXT_COLUMN_HELP = "Text column of a CSV/TSV/JSONL file."
TEXT_B_COLUMN_HELP = "Second text column of a CSV/TSV/JSONL file (sentence pairs)."
LABEL_COLUMN_HELP = "Label column of a CSV/TSV/JSONL file (label names or ids)."
LABELS_HELP = (
    "Label names in id order, comma-separated (e.g. negative,positive); default: the file's label names, "
    "sorted."
)
TEMPLATE_HELP = (
    "Template with {text} (or {text_a} and {text_b}) and [MASK]; default: the packed set's, else "
    "'{text} It was [MASK].' (pairs: '{text_a} ? [MASK] , {text_b}')."
)

__all__ = [
    "DATA_HELP",
    "LABELS_HELP",
    "LABEL_COLUMN_HELP",
    "TEMPLATE_HELP",
    "TEST_DATA_HELP",
    "TEXT_B_COLUMN_HELP",
    "TEXT_COLUMN_HELP",
    "VERBALIZER_HELP",
]
