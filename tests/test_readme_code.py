"""The README's quick start runs as printed (a newcomer pastes it first) and does what its comments say."""

from __future__ import annotations

import re
from pathlib import Path

import torch

import alfa

README = Path(__file__).resolve().parent.parent / "README.md"


def test_the_quick_start_runs_as_printed(tmp_path, monkeypatch, capsys):
    text = README.read_text(encoding="utf-8")
    block = re.search(r"## Quick start\s+```python\n(.*?)```", text, re.S)
    assert block is not None
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(block.group(1), "README.md quick start", "exec"), scope)  # noqa: S102 — our own README
    assert (tmp_path / "user-17.safetensors").is_file() and "total" in capsys.readouterr().out.lower()
    model, base = scope["model"], scope["base_model"]
    x = torch.rand(2, 3, 64, 64)
    with torch.no_grad():  # the user's adapter on the shared base gives the merged model's predictions
        torch.testing.assert_close(base(x), model(x), rtol=1e-5, atol=1e-5)
    alfa.detach(base)
