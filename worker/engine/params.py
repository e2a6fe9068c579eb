"""Exact parameter counts from model configs alone (torch's meta device: no weights) and the comm table."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from fedprompt.shared.methods import MethodConfig, num_parameters
from fedprompt.shared.vocab import EncoderType, Method

CONFIG_DIR = Path(__file__).parent / "configs"
# The public config.json of each model, vendored so the table needs no hub and no weights.
TABLE_MODELS = ("bert-base-uncased", "roberta-base", "t5-base", "all-MiniLM-L6-v2")
TABLE_METHODS: dict[str, dict[str, Any]] = {
    "prompt tuning": {"method": Method.PROMPT_TUNING},
    "P-tuning (MLP)": {"method": Method.P_TUNING, "encoder_type": EncoderType.MLP},
    "P-tuning (LSTM)": {"method": Method.P_TUNING, "encoder_type": EncoderType.LSTM},
    "prefix tuning": {"method": Method.PREFIX_TUNING},
}


def load_config(name_or_path: str) -> Any:
    """A transformers config from a vendored name, a folder or a config.json file."""
    from transformers import AutoConfig

    path = Path(name_or_path)
    if (CONFIG_DIR / name_or_path / "config.json").is_file():
        path = CONFIG_DIR / name_or_path
    if path.is_file():
        data = json.loads(path.read_text())
        return AutoConfig.for_model(data.pop("model_type"), **data)
    return AutoConfig.from_pretrained(str(path))


def count_parameters(config: Any) -> int:
    """Parameters of the model a config describes (its first architecture; tied weights counted once)."""
    import torch
    import transformers

    architecture = (getattr(config, "architectures", None) or [None])[0]
    # a named architecture is built with its own class, else the auto class picks one
    named = getattr(transformers, architecture) if architecture else None
    with torch.device("meta"):
        model = (
            named._from_config(config) if named is not None else transformers.AutoModel.from_config(config)
        )
    return sum(p.numel() for p in model.parameters())


@dataclass
class Row:
    """One line of the communication table."""

    model: str
    params_full_model: int
    method: str
    params_communicated: int
    comm_ratio: float

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form."""
        return asdict(self)


def method_config(config: Any, num_virtual_tokens: int, **method: Any) -> MethodConfig:
    """The method's shape fields for a model config (hidden size and layers as PEFT reads them)."""
    from fedprompt.worker.engine.methods import kv_size, model_shape

    hidden, layers, _ = model_shape(config)
    return MethodConfig(
        num_virtual_tokens=num_virtual_tokens,
        hidden_size=hidden,
        num_layers=layers,
        kv_size=kv_size(config),
        **method,
    )


def comm_table(models: tuple[str, ...] = TABLE_MODELS, num_virtual_tokens: int = 20) -> list[Row]:
    """Parameters communicated per client and direction per round, and their share of the whole model."""
    rows = []
    for name in models:
        config = load_config(name)
        full = count_parameters(config)
        for label, method in TABLE_METHODS.items():
            sent = num_parameters(method_config(config, num_virtual_tokens, **method))
            rows.append(Row(name, full, label, sent, sent / full))
    return rows


def markdown(rows: list[Row]) -> str:
    """The table as Markdown (what the README shows)."""
    lines = [
        "| model | parameters (full model) | method | parameters communicated | share of full model |",
        "|---|---:|---|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r.model} | {r.params_full_model:,} | {r.method} | {r.params_communicated:,} | "
            f"{100 * r.comm_ratio:.4f} % |"
        )
    return "\n".join(lines)
