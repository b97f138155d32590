"""A check two lock tests share: a second worker, started while the caller holds a folder's lock, waits."""

from __future__ import annotations

import threading
import time
from pathlib import Path


def starts_and_waits(second: threading.Thread, folder: Path, capsys, message: str) -> None:
    """Start ``second`` while ``folder``'s lock is held (by the caller): it prints ``message`` (and only it) on
    stderr, and neither trains nor writes anything beside the holder."""
    second.start()
    err, deadline = "", time.time() + 60
    while "waiting" not in err and second.is_alive() and time.time() < deadline:
        err += capsys.readouterr().err
        time.sleep(0.02)
    assert err.strip() == message
    assert second.is_alive() and not folder.exists()
