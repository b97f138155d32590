"""A record of a kind that produce_record has no branch for is refused with the kind and the known ones named,
before anything is built, rather than run as some other kind (the personalization, which the chain's last branch
was)."""

from __future__ import annotations

import pytest
from torch import nn

import alfa.study.bench.produce as produce
from alfa.study.bench.methods import TTA_ROWS
from alfa.study.bench.plan import RecordPlan
from alfa.study.bench.variants import Variant


class _Session:
    """Just enough of a session for produce_record to get as far as its choice of runner."""

    def __init__(self) -> None:
        self.built: list[str] = []

    def model_key(self, plan: RecordPlan) -> str:
        return plan.source

    def build(self, key: str, seed: int) -> object:
        self.built.append(key)
        return object()

    def base(self, src: object, which: str) -> nn.Module:
        return nn.Linear(2, 2)

    def record_hash(self, plan: RecordPlan) -> str:
        return "0" * 12

    def target(self, name: str, seed: int) -> object:
        return object()


def test_an_unknown_record_kind_is_refused_naming_it_and_the_known_kinds(monkeypatch):
    ran: list[str] = []
    monkeypatch.setattr(produce, "_run_personalization", lambda *args: ran.append("personalization") or {})
    session = _Session()
    plan = RecordPlan(Variant(label="mystery", kind="mystery-kind"), "E→M", 0)
    with pytest.raises(ValueError) as refused:
        produce.produce_record(session, plan)  # type: ignore[arg-type]
    known = ", ".join(produce.RUN_KINDS)
    assert str(refused.value) == (
        f"record mystery|E→M|seed0: unknown record kind 'mystery-kind' (the kinds a record is made for: {known})"
    )
    assert ran == [] and session.built == []  # neither run as a personalization nor anything built first


def test_every_planned_kind_has_a_branch():
    planned = {"selection", *produce.KINDS, *produce.OPT_IN_KINDS, *TTA_ROWS}
    assert planned == set(produce.RUN_KINDS) and len(produce.RUN_KINDS) == len(set(produce.RUN_KINDS))
