"""The worker's state directory: credentials and finished-but-unacknowledged updates survive restarts."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class Credentials:
    """What enrolment returned; reused after a restart instead of enrolling again."""

    coordinator: str
    federation_id: int
    client_id: int
    token: str


def _atomic_write(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Write via a temporary file + fsync + rename, so a crash leaves the old or the new file."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


class StateDir:
    """Files under one folder: credentials.json, pending/<round>.safetensors."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.pending_dir = root / "pending"
        self.pending_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(root, 0o700)

    @property
    def credentials_path(self) -> Path:
        """Where the client token is kept (0600)."""
        return self.root / "credentials.json"

    def load_credentials(self, federation_id: int) -> Credentials | None:
        """Saved credentials for this federation, if any (the coordinator's address may have moved)."""
        try:
            data = json.loads(self.credentials_path.read_text())
        except FileNotFoundError:
            return None
        creds = Credentials(**data)
        return creds if creds.federation_id == federation_id else None

    def save_credentials(self, creds: Credentials) -> None:
        """Persist credentials before using them, so a crash never loses an enrolment."""
        _atomic_write(self.credentials_path, json.dumps(asdict(creds)).encode())

    def save_pending(self, round_number: int, blob: bytes) -> Path:
        """Keep a finished update until the coordinator acknowledges it."""
        path = self.pending_dir / f"{round_number}.safetensors"
        _atomic_write(path, blob)
        return path

    def pending(self) -> list[tuple[int, bytes]]:
        """Unacknowledged updates, oldest round first."""
        out = []
        for path in sorted(self.pending_dir.glob("*.safetensors"), key=lambda p: int(p.stem)):
            out.append((int(path.stem), path.read_bytes()))
        return out

    def clear_pending(self, round_number: int) -> None:
        """Forget an update once acknowledged (or definitively refused)."""
        (self.pending_dir / f"{round_number}.safetensors").unlink(missing_ok=True)

    # SCAFFOLD: the client's control variate c_i. A round's new c_i waits beside its pending update
    # and replaces the held one only once the coordinator acknowledged that update (its Δc_i then
    # counts in the server's c); a refused update leaves c_i as it was.

    @property
    def control_path(self) -> Path:
        return self.root / "control.safetensors"

    def load_control(self) -> bytes | None:
        """The held c_i (safetensors), or None before the first acknowledged SCAFFOLD update."""
        try:
            return self.control_path.read_bytes()
        except FileNotFoundError:
            return None

    def save_pending_control(self, round_number: int, blob: bytes) -> None:
        """Keep a round's new c_i until its update is acknowledged."""
        _atomic_write(self.pending_dir / f"{round_number}.control", blob)

    def settle_control(self, round_number: int, *, acknowledged: bool) -> None:
        """Adopt the round's new c_i (acknowledged) or drop it (refused)."""
        path = self.pending_dir / f"{round_number}.control"
        if not path.exists():
            return
        if acknowledged:
            os.replace(path, self.control_path)
        else:
            path.unlink(missing_ok=True)
