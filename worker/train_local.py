"""`fedprompt-worker train-local`: centralised prompt tuning on a whole data set (the non-federated baseline)."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypedDict

import typer
from fedprompt.shared.evalstats import macro_f1
from fedprompt.shared.spec import DEFAULT_MODEL, PRECISION_HELP, check_precision, default_lr
from fedprompt.shared.vocab import LocalOptimizer, Scoring
from fedprompt.worker.data.help import (
    DATA_HELP,
    LABEL_COLUMN_HELP,
    LABELS_HELP,
    TEMPLATE_HELP,
    TEST_DATA_HELP,
    TEXT_B_COLUMN_HELP,
    TEXT_COLUMN_HELP,
    VERBALIZER_HELP,
)
from fedprompt.worker.naming import DATA_NAME_HELP, own_data_name

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress, ProgressColumn


def parse_verbalizer(text: str) -> list[list[str]]:
    """Parse 'terrible;great' or 'bad,terrible;good,great' (labels by ';', words by ',') or a JSON list of lists."""
    from fedprompt.worker.data import DataError
    from fedprompt.worker.data.verbalizer import parse_verbalizer as parse

    try:
        return parse(text)
    except DataError as exc:
        raise typer.BadParameter(str(exc)) from None


def peak_rss_mib() -> float:
    """Peak resident memory of this process in MiB (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


class _Timing(TypedDict):
    """Where training stands: the step reached, training and evaluation seconds, the mean loss once done."""

    train: float
    eval: float
    step: int
    loss: float | None


class Interrupted(Exception):
    """Ctrl-C or SIGTERM: stop training, write what was measured."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def _stop_on_signals() -> Iterator[None]:
    """SIGINT and SIGTERM raise Interrupted in the main thread (once; a second signal waits its turn)."""

    def handler(signum: int, _frame: Any) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise Interrupted(signum)

    old = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, previous in old.items():
            signal.signal(sig, previous)


def train_local_command(
    dataset: str = typer.Option("sst2", "--dataset", "--data", help=DATA_HELP),
    test_data: str | None = typer.Option(None, help=TEST_DATA_HELP),
    text_column: str = typer.Option("text", help=TEXT_COLUMN_HELP),
    text_b_column: str | None = typer.Option(None, help=TEXT_B_COLUMN_HELP),
    label_column: str = typer.Option("label", help=LABEL_COLUMN_HELP),
    labels: str | None = typer.Option(None, help=LABELS_HELP),
    data_name: str | None = typer.Option(None, help=DATA_NAME_HELP),
    model: str = typer.Option(DEFAULT_MODEL, help="Hub id or local path of the frozen language model."),
    steps: int = typer.Option(1500, min=0, help="Optimisation steps."),
    batch_size: int = typer.Option(16, min=1, help="Examples per step."),
    lr: float | None = typer.Option(
        None,
        min=0.0,
        help="Learning rate of the prompt (default with adamw: 0.01 with mean-pool scoring, else the "
        "paper's 0.3; with sgd: 1.0).",
    ),
    local_optimizer: LocalOptimizer = typer.Option(
        LocalOptimizer.ADAMW, help="The optimiser of the steps: adamw, or sgd (plain gradient steps)."
    ),
    num_virtual_tokens: int = typer.Option(20, min=1, help="Soft prompt length."),
    max_length: int = typer.Option(64, min=8, help="Real tokens per input (the virtual tokens come on top)."),
    init: str = typer.Option(
        "vocab",
        help="Prompt initialisation: 'vocab' (embeddings of random words), 'label' (the label words first) "
        "or 'random'.",
    ),
    scoring: str = typer.Option(
        Scoring.AUTO,
        help="Label scores: auto (the LM/MLM head; mean-pool similarity for an encoder without one, e.g. "
        "MiniLM) | tied-embeddings | mean-pool.",
    ),
    init_std: float = typer.Option(0.5, min=0.0, help="Std of the 'random' initialisation."),
    grad_clip: float = typer.Option(1.0, min=0.0, help="Clip the prompt gradient norm (0: off)."),
    seed: int = typer.Option(0, min=0, help="Seed of the initial prompt, batch order and data limits."),
    device: str = typer.Option("auto", help="'auto' (CUDA when available), 'cpu' or 'cuda'."),
    precision: str = typer.Option("auto", help=PRECISION_HELP),
    num_threads: int | None = typer.Option(
        None, "--threads", min=1, help="CPU threads for torch (default: the cores available)."
    ),
    eval_every: int = typer.Option(
        250, min=0, help="Evaluate on the test split every N steps (0: only at the end)."
    ),
    eval_limit: int | None = typer.Option(None, min=1, help="Evaluate on a seeded subset of the test split."),
    eval_batch_size: int = typer.Option(64, min=1, help="Examples per evaluation batch."),
    train_limit: int | None = typer.Option(None, min=1, help="Train on a seeded subset of the train split."),
    template: str | None = typer.Option(None, help=TEMPLATE_HELP),
    verbalizer: str | None = typer.Option(None, help=VERBALIZER_HELP),
    log_every: int | None = typer.Option(
        None,
        min=1,
        help="Without a terminal: a progress line every N steps (default: about 20 lines per run).",
    ),
    out: Path | None = typer.Option(
        None, help="Write the accuracy curve and timings to this JSON file (also when stopped early)."
    ),
) -> None:
    """Tune a soft prompt on a whole data set and report test accuracy along the way.

    Ctrl-C or SIGTERM stops it at once; what was measured until then is written to --out."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from fedprompt.worker.data import DataError, DataSource, choose_prompt, load_splits, parse_labels
    from fedprompt.worker.data.verbalizer import load_tokenizer
    from fedprompt.worker.engine import PromptEngine
    from rich.console import Console
    from rich.markup import escape
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    console = Console(width=None if sys.stdout.isatty() else 160)
    tty = sys.stdout.isatty()
    if not tty:  # a log (simulate's baseline, a pipe): no third-party progress bars in it
        from fedprompt.worker.quiet import quiet_third_party

        quiet_third_party()

    def fail(message: str) -> NoReturn:
        console.print(f"[red]error:[/red] {escape(message)}", soft_wrap=True)
        raise typer.Exit(2)

    if init not in ("vocab", "label", "random"):
        raise typer.BadParameter(f"--init must be 'vocab', 'label' or 'random'; got {init!r}")
    try:
        scoring_choice = Scoring(scoring)
    except ValueError:
        names = [str(name) for name in Scoring]
        raise typer.BadParameter(
            f"--scoring must be {', '.join(names[:-1])} or {names[-1]}; got {scoring!r}"
        ) from None
    try:
        check_precision(precision)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    try:
        source = DataSource(
            data=dataset,
            test_data=test_data,
            text_column=text_column,
            label_column=label_column,
            text_b_column=text_b_column,
            labels=parse_labels(labels),
        )
        splits = load_splits(source)
        if source.is_table:  # a user's file: named after it (or its folder, for train.csv), or --data-name
            splits.train.name = splits.test.name = own_data_name(dataset, data_name)
        train = splits.train.sample(train_limit, seed)
        test = splits.test.sample(eval_limit, seed)
        tmpl, words = choose_prompt(
            name=train.name,
            task=train.task,
            label_names=train.label_names,
            template=template,
            verbalizer=verbalizer,
            tokenizer=load_tokenizer(model),
            model=model,
        )
    except DataError as exc:
        fail(str(exc))

    report: dict[str, Any] = {
        "dataset": train.name,
        "data": dataset,
        "test_data": test_data,
        "held_out": splits.held_out,
        "labels": train.label_names,
        "model": model,
        "template": tmpl,
        "verbalizer": words,
        "config": {
            "steps": steps,
            "batch_size": batch_size,
            "lr": lr,
            "local_optimizer": local_optimizer.value,
            "num_virtual_tokens": num_virtual_tokens,
            "max_length": max_length,
            "init": init,
            "init_std": init_std,
            "grad_clip": grad_clip,
            "seed": seed,
            "train_examples": len(train),
            "test_examples": len(test),
            "num_threads": num_threads,
        },
        "curve": [],
        "command": " ".join(sys.argv),
    }
    curve: list[dict[str, Any]] = report["curve"]
    timing: _Timing = {"train": 0.0, "eval": 0.0, "step": 0, "loss": None}

    def write_out() -> None:
        if out is None:
            return
        last = curve[-1] if curve else {}
        # a stopped run has no final figure: its last evaluation may be the start's (step 0)
        final = last if "stopped" not in report else {}
        start = curve[0] if curve and curve[0]["step"] == 0 else {}
        steps_done = int(timing["step"])
        report.update(
            {
                "status": "partial" if "stopped" in report else "complete",
                "initial_accuracy": start.get("accuracy"),
                "final_accuracy": final.get("accuracy"),
                "final_macro_f1": final.get("macro_f1"),
                "last_evaluation": {"step": last["step"], "accuracy": last["accuracy"]} if last else None,
                "steps_done": steps_done,
                "train_seconds": timing["train"],
                "seconds_per_step": timing["train"] / steps_done if steps_done else 0.0,
                "mean_train_loss": timing["loss"],
                "peak_rss_mib": peak_rss_mib(),
            }
        )
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2) + "\n")
        console.print(f"wrote {escape(str(out))}", soft_wrap=True)

    def evaluate(step: int, printer: Any) -> None:
        result = engine.evaluate(test.examples, batch_size=eval_batch_size)
        curve.append({"step": step, **result.to_dict(), "macro_f1": macro_f1(result.confusion)})
        per_class = " ".join(
            f"{name}={c}/{t}"
            for name, c, t in zip(train.label_names, result.correct, result.total, strict=True)
        )
        label = "zero-shot" if step == 0 else f"step {step}"
        printer(
            escape(
                f"{label}: accuracy={result.accuracy:.4f} macro-F1={curve[-1]['macro_f1']:.4f} "
                f"loss={result.loss:.4f} ({per_class}) [{result.seconds:.1f}s]"
            ),
            soft_wrap=True,
        )

    every = log_every or max(1, steps // 20)
    with _stop_on_signals():
        try:
            started = time.perf_counter()
            engine = PromptEngine.load(
                model,
                template=tmpl,
                verbalizer=words,
                num_virtual_tokens=num_virtual_tokens,
                max_length=max_length,
                init=init,
                init_std=init_std,
                seed=seed,
                device=device,
                num_threads=num_threads,
                scoring=scoring_choice,
                precision=precision,
            )
            load_s = time.perf_counter() - started
            if lr is None:
                lr = default_lr(engine.scoring, model, local_optimizer)
                report["config"]["lr"] = lr
            report |= {
                "fingerprint": engine.fingerprint,
                "head": engine.head,
                "scoring": engine.scoring,
                "device": str(engine.device),
                "precision": engine.precision,
                "load_seconds": load_s,
            }
            reads = "mean-pool" if engine.scoring == "mean-pool" else engine.head
            console.print(
                escape(
                    f"model {model} ({reads} scoring, fingerprint {engine.fingerprint}, hidden "
                    f"{engine.hidden_size}) on {engine.device} loaded in {load_s:.1f}s; {train.name}: "
                    f"{len(train)} train / {len(test)} test"
                    + (" (test: a seeded 10 % held out of the file)" if splits.held_out else "")
                ),
                soft_wrap=True,
            )
            console.print(escape(f"template {tmpl!r} verbalizer {words}"), soft_wrap=True)
            evaluate(0, console.print)
            if steps > 0:
                _train(
                    engine,
                    train,
                    steps=steps,
                    batch_size=batch_size,
                    lr=lr,
                    optimizer=local_optimizer,
                    grad_clip=grad_clip,
                    seed=seed,
                    eval_every=eval_every,
                    evaluate=evaluate,
                    timing=timing,
                    console=console,
                    columns=(
                        TextColumn("[progress.description]{task.description}"),
                        BarColumn(),
                        MofNCompleteColumn(),
                        TextColumn("loss {task.fields[loss]:.4f}"),
                        TimeRemainingColumn(),
                    )
                    if tty
                    else None,
                    progress_cls=Progress,
                    every=every,
                )
                evaluate(steps, console.print)
        except Interrupted as stop:
            report["stopped"] = {"signal": stop.args[0], "at_step": int(timing["step"])}
            console.print(
                f"[yellow]stopped by {stop.args[0]}[/] at step {timing['step']} of {steps}"
                + (
                    "; writing what was measured, labelled partial (no final accuracy)"
                    if out is not None
                    else ""
                ),
                soft_wrap=True,
            )
            write_out()
            raise typer.Exit(130 if stop.signum == signal.SIGINT else 143) from None

    final = curve[-1]
    s_per_step = timing["train"] / steps if steps else 0.0
    console.print(
        f"final accuracy={final['accuracy']:.4f} macro-F1={final['macro_f1']:.4f} loss={final['loss']:.4f} "
        f"steps={steps} s/step={s_per_step:.3f} peak_rss={peak_rss_mib():.0f}MiB"
    )
    write_out()


def _train(
    engine: Any,
    train: Any,
    *,
    steps: int,
    batch_size: int,
    lr: float,
    optimizer: str,
    grad_clip: float,
    seed: int,
    eval_every: int,
    evaluate: Any,
    timing: _Timing,
    console: Console,
    columns: tuple[ProgressColumn, ...] | None,
    progress_cls: type[Progress],
    every: int,
) -> None:
    """Train with a progress bar on a terminal, else a line every `every` steps; an evaluation every
    `eval_every` steps (not counted as training time). `timing` holds the step reached and the seconds."""
    started = time.perf_counter()
    bar = progress_cls(*columns, console=console, transient=False) if columns else None
    with bar if bar is not None else contextlib.nullcontext():
        task_id = bar.add_task("training", total=steps, loss=float("nan")) if bar is not None else None
        printer = bar.console.print if bar is not None else console.print

        def on_step(step: int, total: int, loss: float) -> None:
            timing["step"] = step
            timing["train"] = time.perf_counter() - started - timing["eval"]
            if bar is not None and task_id is not None:
                bar.update(task_id, completed=step, loss=loss)
            elif step % every == 0 or step == total:
                rate = timing["train"] / step
                console.print(
                    f"step {step}/{total} loss {loss:.4f} ({rate:.2f} s/step, "
                    f"{_duration(rate * (total - step))} to go)",
                    soft_wrap=True,
                )
            if eval_every and step % eval_every == 0 and step < total:
                t0 = time.perf_counter()
                evaluate(step, printer)
                timing["eval"] += time.perf_counter() - t0

        result = engine.train(
            train.examples,
            steps=steps,
            batch_size=batch_size,
            lr=lr,
            optimizer=optimizer,
            grad_clip=grad_clip,
            seed=seed,
            progress=on_step,
        )
    # Evaluations ran inside the training loop; they are not training time.
    timing["train"] = result.seconds - timing["eval"]
    timing["loss"] = result.mean_loss


def _duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 90:
        return f"{seconds:.0f}s"
    if seconds < 5400:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"
