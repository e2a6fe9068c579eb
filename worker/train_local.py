"""`fedprompt-worker train-local`: centralised prompt tuning on a whole data set (the non-federated baseline)."""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

import typer

from shared.spec import DEFAULT_MODEL


def parse_verbalizer(text: str) -> list[list[str]]:
    """Parse 'terrible;great' or 'bad,terrible;good,great' (labels by ';', words by ',') or a JSON list of lists."""
    text = text.strip()
    if text.startswith("["):
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise typer.BadParameter(f"verbalizer is not valid JSON: {exc.msg}") from None
        if not isinstance(value, list) or not all(
            isinstance(words, list) and words and all(isinstance(w, str) and w.strip() for w in words)
            for words in value
        ):
            raise typer.BadParameter(
                'verbalizer JSON must be a list of lists of words, e.g. [["bad"], ["good"]]'
            )
        return value
    labels = [[w.strip() for w in part.split(",") if w.strip()] for part in text.split(";")]
    if len(labels) < 2 or any(not words for words in labels):
        raise typer.BadParameter("verbalizer needs words for at least two labels, e.g. 'terrible;great'")
    return labels


def peak_rss_mib() -> float:
    """Peak resident memory of this process in MiB (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


def train_local_command(
    dataset: str = typer.Option(
        "sst2", help="Data set name (under shared/datasets or $FEDPROMPT_DATASETS) or folder."
    ),
    model: str = typer.Option(DEFAULT_MODEL, help="Hub id or local path of the frozen masked LM."),
    steps: int = typer.Option(1500, min=0, help="Optimisation steps."),
    batch_size: int = typer.Option(16, min=1, help="Examples per step."),
    lr: float = typer.Option(0.3, min=0.0, help="AdamW learning rate of the prompt (the paper: 0.3)."),
    num_virtual_tokens: int = typer.Option(20, min=1, help="Soft prompt length."),
    max_length: int = typer.Option(64, min=8, help="Real tokens per input (the virtual tokens come on top)."),
    init: str = typer.Option(
        "vocab", help="Prompt initialisation: 'vocab' (embeddings of random words) or 'random'."
    ),
    init_std: float = typer.Option(0.5, min=0.0, help="Std of the 'random' initialisation."),
    grad_clip: float = typer.Option(1.0, min=0.0, help="Clip the prompt gradient norm (0: off)."),
    seed: int = typer.Option(0, min=0, help="Seed of the initial prompt, batch order and data limits."),
    device: str = typer.Option("auto", help="'auto' (CUDA when available), 'cpu' or 'cuda'."),
    num_threads: int | None = typer.Option(None, min=1, help="CPU threads (default: the cores available)."),
    eval_every: int = typer.Option(
        250, min=0, help="Evaluate on the test split every N steps (0: only at the end)."
    ),
    eval_limit: int | None = typer.Option(None, min=1, help="Evaluate on a seeded subset of the test split."),
    eval_batch_size: int = typer.Option(64, min=1, help="Examples per evaluation batch."),
    train_limit: int | None = typer.Option(None, min=1, help="Train on a seeded subset of the train split."),
    template: str | None = typer.Option(None, help="Template with {text} or {text_a}/{text_b} and [MASK]."),
    verbalizer: str | None = typer.Option(
        None, help="Label words, e.g. 'terrible;great' or JSON [[..],[..]]."
    ),
    out: Path | None = typer.Option(None, help="Write the accuracy curve and timings to this JSON file."),
) -> None:
    """Tune a soft prompt on a whole data set and report test accuracy along the way."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from worker.data import DataError, load_dataset, preset_for
    from worker.engine import PromptEngine

    console = Console()
    if init not in ("vocab", "random"):
        raise typer.BadParameter(f"--init must be 'vocab' or 'random'; got {init!r}")
    try:
        train = load_dataset(dataset, "train").sample(train_limit, seed)
        test = load_dataset(dataset, "test").sample(eval_limit, seed)
    except DataError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    words = parse_verbalizer(verbalizer) if verbalizer is not None else None
    tmpl = template
    if tmpl is None or words is None:
        try:
            preset = preset_for(train.name, train.task)
        except KeyError as exc:
            console.print(f"[red]error:[/red] {exc.args[0]}")
            raise typer.Exit(2) from None
        tmpl = tmpl if tmpl is not None else preset.template
        words = words if words is not None else preset.verbalizer
    if len(words) != train.num_labels:
        raise typer.BadParameter(f"verbalizer has {len(words)} labels; {train.name} has {train.num_labels}")

    started = time.perf_counter()
    engine = PromptEngine.load(
        model,
        template=tmpl,
        verbalizer=words,
        num_virtual_tokens=num_virtual_tokens,
        max_length=max_length,
        init=init,  # type: ignore[arg-type]
        init_std=init_std,
        seed=seed,
        device=device,
        num_threads=num_threads,
    )
    load_s = time.perf_counter() - started
    console.print(
        f"model {model} ({engine.head} scoring, fingerprint {engine.fingerprint}, hidden {engine.hidden_size}) "
        f"on {engine.device} loaded in {load_s:.1f}s; {train.name}: {len(train)} train / {len(test)} test"
    )
    console.print(f"template {tmpl!r} verbalizer {words}")

    curve: list[dict[str, Any]] = []
    train_seconds = 0.0

    def evaluate(step: int, printer: Any) -> None:
        result = engine.evaluate(test.examples, batch_size=eval_batch_size)
        curve.append({"step": step, **result.to_dict()})
        per_class = " ".join(
            f"{name}={c}/{t}"
            for name, c, t in zip(train.label_names, result.correct, result.total, strict=True)
        )
        label = "zero-shot" if step == 0 else f"step {step}"
        printer(
            f"{label}: accuracy={result.accuracy:.4f} loss={result.loss:.4f} ({per_class}) [{result.seconds:.1f}s]"
        )

    evaluate(0, console.print)
    last_result = None
    if steps > 0:
        columns = (
            TextColumn("[progress.description]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]:.4f}"),
            TimeRemainingColumn(),
        )
        with Progress(*columns, console=console, transient=False) as progress:
            task_id = progress.add_task("training", total=steps, loss=float("nan"))
            last_eval = {"t": 0.0}

            def on_step(step: int, total: int, loss: float) -> None:
                progress.update(task_id, completed=step, loss=loss)
                if eval_every and step % eval_every == 0 and step < total:
                    t0 = time.perf_counter()
                    evaluate(step, progress.console.print)
                    last_eval["t"] += time.perf_counter() - t0

            last_result = engine.train(
                train.examples,
                steps=steps,
                batch_size=batch_size,
                lr=lr,
                grad_clip=grad_clip,
                seed=seed,
                progress=on_step,
            )
            # Evaluations ran inside the training loop; they are not training time.
            train_seconds = last_result.seconds - last_eval["t"]
        evaluate(steps, console.print)

    final = curve[-1]
    s_per_step = train_seconds / steps if steps else 0.0
    console.print(
        f"final accuracy={final['accuracy']:.4f} loss={final['loss']:.4f} steps={steps} s/step={s_per_step:.3f} "
        f"peak_rss={peak_rss_mib():.0f}MiB"
    )
    if out is not None:
        report = {
            "dataset": train.name,
            "model": model,
            "fingerprint": engine.fingerprint,
            "head": engine.head,
            "device": str(engine.device),
            "template": tmpl,
            "verbalizer": words,
            "config": {
                "steps": steps,
                "batch_size": batch_size,
                "lr": lr,
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
            "curve": curve,
            "final_accuracy": final["accuracy"],
            "train_seconds": train_seconds,
            "seconds_per_step": s_per_step,
            "load_seconds": load_s,
            "mean_train_loss": last_result.mean_loss if last_result else None,
            "peak_rss_mib": peak_rss_mib(),
            "command": " ".join(sys.argv),
        }
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2) + "\n")
        console.print(f"wrote {out}")
