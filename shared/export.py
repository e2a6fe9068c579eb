"""Export a federation's prompt as a HF PEFT adapter folder (numpy only: the coordinator serves it).

The folder holds ``adapter_config.json`` and ``adapter_model.safetensors`` with one tensor,
``prompt_embeddings``: what ``PeftModel.save_pretrained`` writes for every prompt-learning method, i.e. the
virtual tokens (or per-layer key/value prefixes) the model sees. For P-tuning and projected prefixes the
encoder that was trained and communicated is run once here (shared.methods.materialise) to produce them.
``peft.PeftModel.from_pretrained(base_model, folder)`` loads the result.
"""

from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np
from fedprompt.shared.methods import PROMPT_TENSOR, materialise, peft_adapter_config
from fedprompt.shared.spec import FederationSpec
from safetensors.numpy import save as st_save

CONFIG_NAME = "adapter_config.json"
WEIGHTS_NAME = "adapter_model.safetensors"
FORMATS = ("peft",)


class ExportError(ValueError):
    """The prompt cannot be exported in the asked format."""


def peft_files(
    spec: FederationSpec, tensors: Mapping[str, np.ndarray], *, version: int | None = None
) -> dict[str, bytes]:
    """File name → bytes of the PEFT adapter for a prompt of this federation."""
    cfg = spec.method_config()
    try:
        config = peft_adapter_config(
            cfg, family=spec.family, base_model=spec.model, num_attention_heads=spec.num_attention_heads
        )
    except ValueError as exc:
        raise ExportError(str(exc)) from None
    prompt = materialise(cfg, tensors)
    expected = (cfg.num_virtual_tokens, cfg.prompt_width())
    if prompt.shape != expected:
        raise ExportError(f"materialised prompt has shape {list(prompt.shape)}; expected {list(expected)}")
    metadata = {"format": "pt", "fedprompt_method": spec.method}
    if version is not None:
        metadata["fedprompt_version"] = str(version)
    weights = st_save({PROMPT_TENSOR: np.ascontiguousarray(prompt, dtype=np.float32)}, metadata=metadata)
    return {
        CONFIG_NAME: (json.dumps(config, indent=2, sort_keys=True) + "\n").encode(),
        WEIGHTS_NAME: weights,
    }


def peft_zip(spec: FederationSpec, tensors: Mapping[str, np.ndarray], *, version: int | None = None) -> bytes:
    """The adapter folder as a zip archive (what GET …/export?format=peft returns)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, data in sorted(peft_files(spec, tensors, version=version).items()):
            archive.writestr(name, data)
    return buffer.getvalue()


def unpack(archive: bytes, out: Path) -> list[Path]:
    """Write an export zip's files into a folder (created if needed); refuses paths that leave it."""
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    with zipfile.ZipFile(io.BytesIO(archive)) as zf:
        for info in zf.infolist():
            name = Path(info.filename)
            if name.is_absolute() or ".." in name.parts or len(name.parts) != 1:
                raise ExportError(f"export archive holds an unexpected path {info.filename!r}")
            target = out / name.name
            target.write_bytes(zf.read(info))
            written.append(target)
    return written


def write_peft(spec: FederationSpec, tensors: Mapping[str, np.ndarray], out: Path) -> list[Path]:
    """Write the adapter folder directly (tests, and callers that hold the tensors)."""
    files = peft_files(spec, tensors)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, data in files.items():
        (out / name).write_bytes(data)
        paths.append(out / name)
    return paths
