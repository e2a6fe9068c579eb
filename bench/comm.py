"""Communication: bytes on the wire per client per round, headers included, vs full fine-tuning.

    python -m bench.comm

A real coordinator process (SQLite) on loopback; one client's traffic goes through a counting TCP
proxy, so every byte of request and response (status lines, headers, bodies) is counted. The client
is the workers' own ``CoordinatorClient`` and makes the calls a worker makes in one round:
poll → train task (from the version it evaluated last, which it keeps: no download), upload the
update, poll → evaluate task, download the new version, report the evaluation. Bodies are counted separately (httpx event hooks), so
headers = wire − bodies.

Baselines in the same run: the raw tensor bytes of the communicated prompt (float32), and a full
fine-tuning round of the same model (its whole state dict as safetensors down and up, same headers).
Every prompt method and model size in ``shared.spec.FederationSpec`` is measured, ``--repeats``
times (each in a federation of its own); the table shows the first, the file keeps every repeat's ratio.
"""

from __future__ import annotations

import argparse
import contextlib
import socket
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from fedprompt.shared import wire
from fedprompt.shared.client import CoordinatorClient
from fedprompt.shared.contract import EvaluateTask, TrainTask
from fedprompt.shared.spec import FederationSpec
from fedprompt.shared.vocab import Method

from bench.common import ratio, write_result

ADMIN = "bench-admin-token-0123456789abcdef"
# (label, hidden size, layers, heads) of the models measured: the offline default and a BERT-base-sized one.
MODELS = [("all-MiniLM-L6-v2", 384, 6, 12), ("bert-base (config)", 768, 12, 12)]


class CountingProxy:
    """A loopback TCP proxy that counts the bytes in each direction."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream = upstream_port
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.up = 0
        self.down = 0
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.upstream))
            threading.Thread(target=self._pump, args=(conn, upstream, "up"), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, conn, "down"), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, direction: str) -> None:
        try:
            while data := src.recv(65536):
                with self.lock:
                    setattr(self, direction, getattr(self, direction) + len(data))
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def snapshot(self) -> tuple[int, int]:
        """(bytes up, bytes down) so far."""
        with self.lock:
            return self.up, self.down

    def close(self) -> None:
        """Stop accepting."""
        self.sock.close()


def methods() -> list[str]:
    """The prompt methods the spec offers."""
    return list(Method)


def _spec_kwargs(method: str, hidden: int, layers: int, heads: int) -> dict[str, Any]:
    """Spec fields for a method and model size (fields the spec does not have are left out)."""
    fields = FederationSpec.model_fields
    kw: dict[str, Any] = {"method": method, "hidden_size": hidden, "num_virtual_tokens": 20}
    for name, value in (
        ("num_layers", layers),
        ("num_hidden_layers", layers),
        ("num_attention_heads", heads),
    ):
        if name in fields:
            kw[name] = value
    return kw


def measure_round(url: str, method: str, hidden: int, layers: int, heads: int) -> dict[str, Any]:
    """One federation of 2 clients; client A's traffic through the proxy for one round."""
    admin = CoordinatorClient(url, ADMIN)
    spec_kw = _spec_kwargs(method, hidden, layers, heads)
    spec = FederationSpec(name=f"comm-{method}-{hidden}", min_clients=2, fraction=1.0, rounds=3, **spec_kw)
    fid = admin.create_federation(spec.model_dump(mode="json")).id
    enrol = admin.create_enrollment_token(fid, max_uses=2)
    port = int(url.rsplit(":", 1)[1])
    proxy = CountingProxy(port)
    bodies = {"up": 0, "down": 0}

    def on_request(request: httpx.Request) -> None:
        bodies["up"] += len(request.content)

    def on_response(response: httpx.Response) -> None:
        response.read()
        bodies["down"] += len(response.content)

    clients = []
    for i, via in enumerate((f"http://127.0.0.1:{proxy.port}", url)):
        c = CoordinatorClient(via)
        cred = c.enroll(fid, enrol, name=f"site-{i}", num_samples=100 * (i + 1), info={})
        c.close()
        client = CoordinatorClient(via, cred.token)
        clients.append(client)
    a, b = clients
    a.http.event_hooks = {"request": [on_request], "response": [on_response]}
    rng = np.random.default_rng(0)
    last: dict[int, tuple[int, bytes]] = {}  # per client: the last version fetched, as the worker keeps it

    def fetch(c: CoordinatorClient, version: int) -> bytes:
        if id(c) in last and last[id(c)][0] == version:
            return last[id(c)][1]
        blob = c.prompt(fid, version).blob
        last[id(c)] = (version, blob)
        return blob

    def evaluate(c: CoordinatorClient) -> None:
        task = c.task(fid, wait=30)  # the round closes in the background after the last upload
        assert isinstance(task, EvaluateTask), task
        fetch(c, task.version)
        c.report_evaluation(fid, task.version, {"num_samples": 50, "accuracy": 0.5, "loss": 0.7})

    def train(c: CoordinatorClient) -> bytes:
        task = c.task(fid)
        assert isinstance(task, TrainTask), task
        blob_in = fetch(c, task.version)  # the version this client just evaluated: no download
        tensors = {
            n: (t + rng.standard_normal(t.shape) * 0.01).astype(np.float32)
            for n, t in wire.decode(blob_in)[0].items()
        }
        meta = {
            "method": method,
            "base_version": str(task.version),
            "round": str(task.round),
            "num_samples": "100",
            "metrics": {
                "loss": 0.6931471805599453,
                "last_loss": 0.6789012345678901,
                "seconds": 12.345678901234,
            },
            # what worker/agent.py stamps into every update
            "timing": {
                "task_received_at": time.time(),
                "download_s": 0.012345678901234,
                "slot_wait_s": 0.000123456789012,
                "trained_at": time.time(),
            },
        }
        blob = wire.encode(tensors, meta)
        c.upload(fid, task.round, blob)
        return blob

    for c in clients:  # version 0 is evaluated before round 1; not part of a round
        evaluate(c)
    start_wire, start_body = proxy.snapshot(), dict(bodies)
    blob = train(a)
    train(b)  # the round closes: A's next task is the evaluation of version 1
    evaluate(a)
    end_wire = proxy.snapshot()
    up, down = end_wire[0] - start_wire[0], end_wire[1] - start_wire[1]
    body_up, body_down = bodies["up"] - start_body["up"], bodies["down"] - start_body["down"]
    # one empty long-poll answer (204), the cost of each idle poll while waiting
    before = proxy.snapshot()
    a.task(fid, wait=0)
    after = proxy.snapshot()
    idle_poll = (after[0] - before[0]) + (after[1] - before[1])
    for c in (a, b, admin):
        c.close()
    proxy.close()
    tensor_bytes = spec.prompt_bytes()
    transfers = 2  # update up, new version down for evaluation (training starts from the version evaluated)
    headers = (up - body_up) + (down - body_down)
    return {
        "method": method,
        "hidden_size": hidden,
        "tensor_shapes": {k: list(v) for k, v in spec.tensor_shapes().items()},
        "tensor_bytes": tensor_bytes,
        "update_blob_bytes": len(blob),
        "safetensors_overhead": ratio(len(blob), tensor_bytes),
        "wire_up": up,
        "wire_down": down,
        "wire_total": up + down,
        "body_up": body_up,
        "body_down": body_down,
        "header_bytes": headers,
        "prompt_transfers": transfers,
        "raw_plus_headers": transfers * tensor_bytes + headers,
        "ratio_to_raw_plus_headers": ratio(up + down, transfers * tensor_bytes + headers),
        "idle_poll_bytes": idle_poll,
    }


def full_state_dict_bytes(label: str, hidden: int, layers: int, heads: int) -> dict[str, Any]:
    """Bytes of the model's full state dict as safetensors (what full fine-tuning would send)."""
    import torch
    from safetensors.torch import save
    from transformers import BertConfig, BertModel

    if label.startswith("all-MiniLM"):
        from fedprompt.worker.engine.offline import resolve_model
        from transformers import AutoModel

        model = AutoModel.from_pretrained(resolve_model(FederationSpec().model))
        state = {k: v.contiguous() for k, v in model.state_dict().items()}
        size = len(save(state))
        params = sum(v.numel() for v in state.values())
        return {"bytes": size, "parameters": params, "source": "the offline checkpoint's state dict"}
    config = BertConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads)
    with torch.device("meta"):
        model = BertModel(config)
    state = model.state_dict()
    params = sum(v.numel() for v in state.values())
    header = sum(len(k) + 60 for k in state)  # safetensors JSON header: name, dtype, shape, offsets
    return {
        "bytes": 4 * params + header + 8,
        "parameters": params,
        "source": "BertConfig defaults (meta device)",
    }


def main(argv: list[str] | None = None) -> None:
    """Measure every method × model size and write bench/results/comm.json."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="MiniLM only, no full state dict load")
    ap.add_argument(
        "--repeats", type=int, default=3, help="rounds measured per method (each a new federation)"
    )
    ap.add_argument("--out-dir", default=None)
    args = ap.parse_args(argv)
    from tests.helpers import coordinator_process  # the same real-process launcher the e2e tests use

    models = MODELS[:1] if args.quick else MODELS
    rows = []
    with tempfile.TemporaryDirectory(prefix="fedprompt-comm-") as tmp:
        db = f"sqlite:///{Path(tmp) / 'c.db'}"
        with coordinator_process(db, Path(tmp), extra_env={"FEDPROMPT_ADMIN_TOKEN": ADMIN}) as (url, _):
            for label, hidden, layers, heads in models:
                full = None if args.quick else full_state_dict_bytes(label, hidden, layers, heads)
                for method in methods():
                    runs = [measure_round(url, method, hidden, layers, heads) for _ in range(args.repeats)]
                    row = runs[0]
                    row["model"] = label
                    row["repeat_ratios"] = [r["ratio_to_raw_plus_headers"] for r in runs]
                    row["repeat_wire_totals"] = [r["wire_total"] for r in runs]
                    if full is not None:
                        # a full fine-tuning round moves the state dict down and up, with the same headers
                        full_round = 2 * full["bytes"] + row["header_bytes"]
                        row["full_finetuning"] = {**full, "round_bytes": full_round}
                        row["ratio_to_full_finetuning"] = ratio(row["wire_total"], full_round)
                    rows.append(row)
                    print(
                        f"{label} {method}: {row['wire_total']} B/round on the wire "
                        f"({row['ratio_to_raw_plus_headers']:.4f}x raw+headers; safetensors "
                        f"{row['safetensors_overhead']:.4f}x raw"
                        + (f"; {row['ratio_to_full_finetuning']:.2e}x full FT)" if full else ")"),
                        flush=True,
                    )
    path = write_result(
        "comm", {"rows": rows, "quick": args.quick}, out_dir=Path(args.out_dir) if args.out_dir else None
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
