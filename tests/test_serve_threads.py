"""One served model shared by two threads (a web framework's pool): each call gets its own users' predictions.

The layers of a served model hold one call's users (or mixes) while it runs; a second thread's call in the middle
of the first used to overwrite them. The interleaving is forced here, not left to chance: the first call pauses
inside the model until the second has run (the old code) or for half a second (the second waits on the lock).
"""

from __future__ import annotations

import copy
import pickle
import threading

import pytest
import torch
from test_serve import _user

import alfa
from alfa.serve import MixedBatchModel


@pytest.fixture
def base(small_net):
    alfa.truncate(small_net, rank=6)
    return small_net.eval()


def _interleaved(pause_in: torch.nn.Module, first, second) -> tuple[object, object]:
    """``first()`` in a thread that pauses when it reaches ``pause_in`` while ``second()`` runs in another thread;
    their results (an exception counts as a result)."""
    inside, second_done = threading.Event(), threading.Event()
    results: dict[str, object] = {}
    first_thread: list[threading.Thread] = []

    def pause(module, args):  # noqa: ANN001, ANN202 — a forward pre-hook
        if threading.current_thread() is first_thread[0] and not inside.is_set():
            inside.set()
            second_done.wait(timeout=0.5)  # the second call's whole run, unless it waits for this one to finish

    def run(key, call, after=None):  # noqa: ANN001, ANN202
        if after is not None:
            after.wait(timeout=10)
        try:
            results[key] = call()
        except Exception as e:  # noqa: BLE001 — the test compares it with the expected tensor
            results[key] = e
        if key == "second":
            second_done.set()

    handle = pause_in.register_forward_pre_hook(pause)
    try:
        threads = [threading.Thread(target=run, args=("first", first))]
        threads.append(threading.Thread(target=run, args=("second", second, inside)))
        first_thread.append(threads[0])
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
    finally:
        handle.remove()
    return results["first"], results["second"]


def _same(out, expected) -> bool:
    return isinstance(out, torch.Tensor) and float((out - expected).norm() / expected.norm()) < 1e-6


def test_two_threads_calling_one_multi_user_model_each_get_their_users(base):
    served = alfa.MultiUserModel(base)
    served.add_user("ann", _user(base, alfa.LoraConfig(rank=2), 1))
    served.add_user("bob", _user(base, alfa.AlfaConfig(heads=2, rank=2), 2))
    x = torch.rand(3, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    expected = {u: served(x, [u] * 3) for u in ("ann", "bob")}
    assert not _same(expected["ann"], expected["bob"])
    first, second = _interleaved(served.model.bn1, lambda: served(x, ["ann"] * 3), lambda: served(x, ["bob"] * 3))
    assert _same(first, expected["ann"]), first
    assert _same(second, expected["bob"]), second
    # a copy gets its own lock (a lock cannot be copied) and serves the same
    for copied in (copy.deepcopy(served), pickle.loads(pickle.dumps(served))):
        assert _same(copied(x, ["bob"] * 3), expected["bob"])
    # one pickled before the locks existed (its state has none) gets its own on loading, and serves
    older = copy.deepcopy(served)
    del older.__dict__["_lock"], older.__dict__["_load_lock"]
    assert _same(pickle.loads(pickle.dumps(older))(x, ["bob"] * 3), expected["bob"])


def test_two_threads_calling_one_mixed_batch_model_each_get_their_mixes(base):
    served = alfa.MultiUserModel(base)
    served.add_user("ann", _user(base, alfa.AlfaConfig(heads=2, rank=2), 1))
    served.add_user("bob", _user(base, alfa.DiagGateConfig(), 2))
    mixed = MixedBatchModel(base)
    x = torch.rand(3, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    mixes = {u: mixed.mixes(served, [u] * 3) for u in ("ann", "bob")}
    with torch.no_grad():
        expected = {u: mixed(x, *mixes[u]) for u in mixes}

    def call(user):  # noqa: ANN001, ANN202
        with torch.no_grad():
            return mixed(x, *mixes[user])

    first, second = _interleaved(mixed.model.bn1, lambda: call("ann"), lambda: call("bob"))
    assert _same(first, expected["ann"]), first
    assert _same(second, expected["bob"]), second
    older = copy.deepcopy(mixed)
    del older.__dict__["_lock"]  # as pickled before the lock existed
    with torch.no_grad():
        assert _same(pickle.loads(pickle.dumps(older))(x, *mixes["bob"]), expected["bob"])
