"""Export of a federation's prompt in outside formats (a PEFT adapter folder, zipped)."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Query, Response
from fedprompt.coordinator.api.deps import AdminDep, ServiceDep
from fedprompt.coordinator.api.jsonbody import BoundedJSONRoute
from fedprompt.coordinator.api.problems import API_ERRORS
from fedprompt.coordinator.api.schemas import VERSION_PATTERN, IdPath
from fedprompt.coordinator.hosting.paths import FEDERATIONS

router = APIRouter(prefix=FEDERATIONS, tags=["export"], responses=API_ERRORS, route_class=BoundedJSONRoute)


@router.get(
    "/{fid}/export",
    dependencies=[AdminDep],
    response_class=Response,
    responses={
        200: {
            "content": {"application/zip": {}},
            "description": "adapter_config.json + adapter_model.safetensors",
        }
    },
)
def export_prompt(
    fid: IdPath,
    service: ServiceDep,
    format: Literal["peft"] = Query(
        "peft", description="Export format: 'peft' (PeftModel.from_pretrained loads it)."
    ),
    version: str = Query(
        "best",
        pattern=VERSION_PATTERN,
        description="Prompt version number, 'latest', or 'best' (the default: the best evaluated version, "
        "the latest before any evaluation).",
    ),
) -> Response:
    """A prompt version as a zipped PEFT adapter folder."""
    filename, archive = service.federations.export_prompt(fid, version, format)
    return Response(
        archive,
        media_type="application/zip",
        headers={"Content-Disposition": f'attachment; filename="{filename}"'},
    )
