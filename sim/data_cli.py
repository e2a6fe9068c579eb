"""`fedprompt data`: the data sets this machine has (`list`), a user's file packed as one (`import`), and
the paper's eight sets from the Hugging Face hub (`fetch`).

Bare data set names are looked up in $FEDPROMPT_DATASETS, then in the user's data folder
($XDG_DATA_HOME/fedprompt/datasets, else ~/.local/share/fedprompt/datasets), where `import` and
`fetch` write unless --dest says otherwise, then in the data sets built into the package (SST-2).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, Any

import typer
from fedprompt.worker.data.help import (
    LABEL_COLUMN_HELP,
    LABELS_HELP,
    TEXT_B_COLUMN_HELP,
    TEXT_COLUMN_HELP,
)
from rich.console import Console
from rich.markup import escape

data_app = typer.Typer(
    help="Data sets: list what this machine has, import your own file, fetch the paper's sets.",
    no_args_is_help=True,
)
console = Console()
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")

DestOpt = Annotated[
    Path | None,
    typer.Option(help="Folder to write the packed data set into (default: the user's data folder)."),
]


def _fail(message: str, code: int = 2) -> typer.Exit:
    console.print(f"[red]error:[/] {escape(message)}", soft_wrap=True)
    return typer.Exit(code)


def _size(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return str(size)


def _rows(n: int | None) -> str:
    return "-" if n is None else f"{n:,}"


@data_app.command("list")
def list_command(
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable JSON output.")] = False,
) -> None:
    """The packed data sets found (name, task, labels, rows per split, size, where each comes from: built-in,
    $FEDPROMPT_DATASETS or the user's data folder, source, folder) and the paper's sets that can be fetched."""
    from fedprompt.sim.hub import HUB_SETS
    from fedprompt.worker.data import (
        DATASETS_ENV,
        builtin_datasets_dir,
        dataset_dirs,
        dataset_origin,
        packed_folders,
        user_datasets_dir,
    )
    from fedprompt.worker.data.pack import describe

    dirs = dataset_dirs()
    found = [describe(folder) | {"from": dataset_origin(folder)} for folder in packed_folders(dirs).values()]
    fetchable = [name for name in HUB_SETS if name not in {d["name"] for d in found}]
    builtin = sorted(packed_folders([builtin_datasets_dir()]))
    # built-in sets a copy in $FEDPROMPT_DATASETS or the user's data folder takes precedence over
    shadowed = [d for d in found if d["name"] in builtin and d["from"] != "built-in"]
    if as_json:
        payload = {
            "searched": [str(d) for d in dirs],
            "builtin": str(builtin_datasets_dir()),
            "builtin_datasets": builtin,
            "writes_to": str(user_datasets_dir()),
            "datasets": found,
            "fetchable": fetchable,
        }
        typer.echo(json.dumps(payload, indent=2))
        return
    import os

    searched = ", ".join(
        ("built-in " if d == builtin_datasets_dir() else "") + f"{d}{'' if d.is_dir() else ' (absent)'}"
        for d in dirs
    )
    if not os.environ.get(DATASETS_ENV):
        searched = f"${DATASETS_ENV} (unset), {searched}"
    if not found:
        console.print(
            escape(
                f"no data sets installed (looked in {searched}); `fedprompt data fetch NAME` and "
                f"`fedprompt data import FILE --name NAME` write them to {user_datasets_dir()}"
            ),
            soft_wrap=True,
        )
    else:
        width = max(len(d["name"]) for d in found)
        for d in found:
            console.print(
                escape(
                    f"{d['name']:<{width}}  {d['task']:<6}  train {_rows(d['train']):>7}  test {_rows(d['test']):>6}  "
                    f"{_size(d['bytes']):>9}  labels {', '.join(d['labels'] or [])}  "
                    f"({d['from']}: {Path(d['folder']).parent})"
                ),
                soft_wrap=True,
            )
            if d["source"]:
                console.print(escape(f"{'':<{width}}  {d['source']}"), soft_wrap=True, style="dim")
        console.print(escape(f"looked in {searched}"), soft_wrap=True)
        if builtin:
            over = "".join(
                f"; {d['name']} is read from {d['from']} ({d['folder']}) instead" for d in shadowed
            )
            console.print(
                escape(
                    f"built-in: {', '.join(builtin)}, shipped with the package for the demo (source and terms in "
                    f"SOURCE.md beside each); a copy in ${DATASETS_ENV} or the user's data folder comes first{over}"
                ),
                soft_wrap=True,
            )
    if fetchable:
        console.print(
            escape(f"not installed, fetchable from the Hugging Face hub: {', '.join(fetchable)} ")
            + "(`fedprompt data fetch NAME`, online)",
            soft_wrap=True,
        )


@data_app.command("import")
def import_command(
    file: Annotated[Path, typer.Argument(help="The train file: CSV, TSV or JSONL(.gz).")],
    name: Annotated[str | None, typer.Option(help="Data set name (default: the file's name).")] = None,
    test_data: Annotated[
        Path | None,
        typer.Option(help="A test file with the same columns (default: hold out --test-fraction of FILE)."),
    ] = None,
    text_column: Annotated[str, typer.Option(help=TEXT_COLUMN_HELP)] = "text",
    text_b_column: Annotated[str | None, typer.Option(help=TEXT_B_COLUMN_HELP)] = None,
    label_column: Annotated[str, typer.Option(help=LABEL_COLUMN_HELP)] = "label",
    labels: Annotated[str | None, typer.Option(help=LABELS_HELP)] = None,
    test_fraction: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="Share held out as the test split (per label).")
    ] = 0.1,
    seed: Annotated[int, typer.Option(help="Seed of the held-out split.")] = 13,
    dest: DestOpt = None,
    force: Annotated[bool, typer.Option("--force", help="Replace a data set of that name.")] = False,
) -> None:
    """Pack a CSV / TSV / JSONL file (and optionally its test file) as a data set: meta.json with the
    label names, splits and checksums, train.jsonl.gz and test.jsonl.gz."""
    from fedprompt.worker.data import DataError, DataSource, load_source, parse_labels, user_datasets_dir
    from fedprompt.worker.data.pack import write_packed
    from fedprompt.worker.data.source import hold_out, table_name

    chosen = name or table_name(file)
    if not NAME.fullmatch(chosen):
        raise _fail(f"--name {chosen!r}: use letters, digits, '_', '.' and '-' (at most 64)")
    try:
        if not file.is_file():
            raise DataError(f"{file}: no such file")
        src = DataSource(
            data=str(file),
            test_data=str(test_data) if test_data else None,
            text_column=text_column,
            label_column=label_column,
            text_b_column=text_b_column,
            labels=parse_labels(labels),
        )
        train, test = load_source(src)
        note = ""
        if test is None:
            train, test = hold_out(train, test_fraction, seed)
            note = f"; test = a seeded {100 * test_fraction:g} % of each label held out (seed {seed})"
        root = dest or user_datasets_dir()
        meta = write_packed(
            root / chosen,
            train,
            test,
            name=chosen,
            source=f"imported from {file.name}" + (f" and {test_data.name}" if test_data else "") + note,
            origin=str(file.resolve()) + (f" + {test_data.resolve()}" if test_data else ""),
            extra={"imported_by": "fedprompt data import"},
            overwrite=force,
        )
    except DataError as exc:
        raise _fail(str(exc)) from None
    _report(root / chosen, meta)


@data_app.command("fetch")
def fetch_command(
    name: Annotated[
        str, typer.Argument(help="sst2, imdb, offenseval, twitter, enron, lingspam, qnli or rte.")
    ],
    dest: DestOpt = None,
    source: Annotated[
        str | None,
        typer.Option(
            "--from",
            help="Load from this hub repository, or a local copy in the hub's layout, instead of the default.",
        ),
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Fetch again over a data set of that name.")] = False,
) -> None:
    """Download one of the paper's data sets from the Hugging Face hub (needs the `datasets` library and a
    network) and pack it, with checksums in meta.json."""
    from fedprompt.sim.hub import FetchError, fetch
    from fedprompt.worker.data import DataError, builtin_datasets_dir, packed_folders, user_datasets_dir

    root = dest or user_datasets_dir()
    try:
        meta = fetch(name, root, source=source, force=force)
    except FetchError as exc:
        builtin = packed_folders([builtin_datasets_dir()]).get(name)
        note = f"; {name} is built in and needs no fetch ({builtin})" if builtin else ""
        raise _fail(str(exc) + note) from None
    except DataError as exc:
        raise _fail(str(exc)) from None
    _report(root / name, meta)


def _report(folder: Path, meta: dict[str, Any]) -> None:
    splits = meta["splits"]
    mix = "; ".join(
        f"{split} {facts['rows']:,} ("
        + ", ".join(f"{label} {n:,}" for label, n in facts["per_label"].items())
        + ")"
        for split, facts in splits.items()
    )
    console.print(
        escape(f"wrote {folder}: {meta['task']}, labels {', '.join(meta['labels'])}; {mix}"), soft_wrap=True
    )
