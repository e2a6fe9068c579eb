"""OpenAPI links: how one operation's answer feeds the next (a federation's id from its creation to
every operation on it, an enrolment token to the enrolment, a client's id and token to its own
operations, a round's number to the round). They document the round and enrolment flows, and let a
schema-driven tester (schemathesis' stateful phase) run them as workflows. Pure: the OpenAPI
document in, the same document with links out.
"""

from __future__ import annotations

from typing import Any

FED = "/api/v1/federations"
FID = "$response.body#/id"


def add_links(openapi: dict[str, Any]) -> dict[str, Any]:
    """`openapi` with a `links` member on the answers that feed other operations (in place)."""
    paths = openapi["paths"]

    def link(source: tuple[str, str, str], target: tuple[str, str], parameters: dict[str, str]) -> None:
        path, method, status = source
        if path not in paths or target[0] not in paths:
            return
        response = paths[path][method]["responses"][status]
        target_id = paths[target[0]][target[1]]["operationId"]
        name = f"{target[1]}-{target_id}"[:60]
        response.setdefault("links", {})[name] = {"operationId": target_id, "parameters": parameters}

    created = (FED, "post", "201")
    status = (FED + "/{fid}", "get", "200")
    for path, ops in paths.items():
        if "{fid}" not in path or "{number}" in path or "{cid}" in path:
            continue  # those come from a round or a client, below
        for method in ops:
            params = {"path.fid": FID}
            if path.endswith("prompts/{version}"):
                params["path.version"] = "latest"
            link(created, (path, method), params)
            link(status, (path, method), {**params, "path.fid": "$request.path.fid"})
    link(
        (FED + "/{fid}/enrollment-tokens", "post", "201"),
        (FED + "/{fid}/clients", "post"),
        {"path.fid": "$request.path.fid", "header.Authorization": "Bearer {$response.body#/token}"},
    )
    enrolled = (FED + "/{fid}/clients", "post", "201")
    as_client = {
        "path.fid": "$response.body#/federation_id",
        "header.Authorization": "Bearer {$response.body#/token}",
    }
    link(enrolled, (FED + "/{fid}/task", "get"), as_client)
    link(enrolled, (FED + "/{fid}/spec", "get"), as_client)
    link(enrolled, (FED + "/{fid}/model-parameters", "put"), as_client)
    link(enrolled, (FED + "/{fid}/rounds/{number}/update", "put"), {**as_client, "path.number": "1"})
    link(enrolled, (FED + "/{fid}/rounds/{number}/evaluation", "post"), {**as_client, "path.number": "0"})
    link(
        enrolled,
        (FED + "/{fid}/clients/{cid}", "delete"),
        {"path.fid": "$response.body#/federation_id", "path.cid": "$response.body#/client_id"},
    )
    opened = (FED + "/{fid}/rounds", "post", "201")
    for target in (
        (FED + "/{fid}/rounds/{number}", "get"),
        (FED + "/{fid}/rounds/{number}/close", "post"),
        (FED + "/{fid}/evaluations/{version}", "get"),
    ):
        number = "path.version" if "{version}" in target[0] else "path.number"
        link(opened, target, {"path.fid": "$request.path.fid", number: "$response.body#/round"})
    return openapi
