"""PnP-GA (alfa.gaze.pnpga): its losses checked by hand, one person's adaptation (determinism, where the
gradients go, what predicts), its cost, and the snapshot ensemble."""

import statistics

import pytest
import torch
from tiny_models import TinyGazeNet

from alfa.checkpoint import load_model
from alfa.gaze.pipeline import open_data
from alfa.gaze.pnpga import (
    AdaptedEnsemble,
    PnPGAConfig,
    adapt_person,
    adaptation_cost,
    ema_decay,
    feature_consistency,
    outlier_loss,
    pnpga_loss,
    source_gaze_loss,
    train_snapshot_members,
)
from alfa.gaze.train import TrainConfig

Z95 = statistics.NormalDist().inv_cdf(0.95)


def _ensemble(values: list[float]) -> torch.Tensor:
    """A (1, 2, K) ensemble whose members predict ``values`` for yaw and 0 for pitch."""
    yaw = torch.tensor(values, dtype=torch.float64)
    return torch.stack([yaw, torch.zeros_like(yaw)]).unsqueeze(0)


def test_outlier_loss_penalizes_only_the_outlier_by_its_z():
    reference = _ensemble([0.0, 0.1, -0.1, 0.05, -0.05])
    mean, std = 0.0, float(reference[0, 0].std())
    pred = _ensemble([0.0, 0.1, -0.1, 0.05, 0.5])  # the last member is far out
    z = [(v - mean) / std for v in (0.0, 0.1, -0.1, 0.05, 0.5)]
    assert [abs(v) > Z95 for v in z] == [False, False, False, False, True]
    # gamma 0: the penalty alone, which is exactly |z| of the outlier
    assert float(outlier_loss(pred, reference, 0.05, gamma=0.0)) == pytest.approx(abs(z[-1]))
    # its gradient reaches the outlier only, with weight 1/std (d|z|/dpred)
    pred.requires_grad_(True)
    outlier_loss(pred, reference, 0.05, gamma=0.0).backward()
    assert pred.grad[0, 0, :4].abs().max() == 0 and pred.grad[0, 1].abs().max() == 0
    assert float(pred.grad[0, 0, 4]) == pytest.approx(1 / std)
    # the CDF term: gamma times the mean |CDF(pred) - 1/2| over the 2 x 5 entries (pitch: 0, at the mean)
    normal = statistics.NormalDist(mean, std)
    cdf = sum(abs(normal.cdf(v) - 0.5) for v in (0.0, 0.1, -0.1, 0.05, 0.5)) / 10
    full = outlier_loss(pred.detach(), reference, 0.05, gamma=0.01)
    assert float(full) == pytest.approx(abs(z[-1]) + 0.01 * cdf)


def test_outlier_loss_threshold_follows_the_significance():
    reference = _ensemble([0.0, 0.1, -0.1, 0.05, -0.05])
    std = float(reference[0, 0].std())
    pred = _ensemble([1.5 * std, 0.0, 0.0, 0.0, 0.0])  # z = 1.5: inside 5 %, outside 10 %
    assert float(outlier_loss(pred, reference, 0.05, gamma=0.0)) == 0.0
    assert float(outlier_loss(pred, reference, 0.10, gamma=0.0)) == pytest.approx(1.5)
    # identical members: no NaN, and agreeing predictions cost nothing
    same = _ensemble([0.2, 0.2, 0.2])
    assert float(outlier_loss(same, same)) == pytest.approx(0.0, abs=1e-6)
    with pytest.raises(ValueError, match="must be one"):
        outlier_loss(pred, reference[..., :3])


def test_feature_consistency_is_zero_for_equal_features_and_symmetric():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(3, 4, 16, generator=g), torch.randn(3, 4, 16, generator=g)
    assert float(feature_consistency(a, a)) == 0.0
    assert float(feature_consistency(a, b)) == pytest.approx(float(feature_consistency(b, a)))
    assert float(feature_consistency(a, b)) > 0
    # by hand: half the two KL divergences of the softmaxes, averaged over every element
    p, q = torch.softmax(a, -1), torch.softmax(b, -1)
    by_hand = 0.5 * ((q * (q.log() - p.log())).mean() + (p * (p.log() - q.log())).mean())
    assert float(feature_consistency(a, b)) == pytest.approx(float(by_hand))


def test_source_loss_and_the_teachers_decay():
    pred = torch.tensor([[[0.1, 0.2]], [[0.3, 0.0]]])  # (K=2, B=1, 2)
    assert float(source_gaze_loss(pred, torch.tensor([[0.1, 0.1]]))) == pytest.approx((0 + 0.1 + 0.2 + 0.1) / 4)
    assert ema_decay(0, 0.99) == 0.0 and ema_decay(9, 0.99) == pytest.approx(0.9) and ema_decay(1000, 0.99) == 0.99


def _members(k: int, seed: int = 0) -> list[torch.nn.Module]:
    torch.manual_seed(seed)
    return [TinyGazeNet().eval() for _ in range(k)]


def _images(n: int, seed: int) -> torch.Tensor:
    return torch.rand(n, 3, 16, 16, generator=torch.Generator().manual_seed(seed))


def test_gradients_reach_exactly_the_students():
    students, teachers = _members(3), _members(3, seed=1)
    for t in teachers:
        t.requires_grad_(False)
    source, labels = _images(4, 1), torch.zeros(4, 2)
    source_before = source.clone()
    loss, parts = pnpga_loss(students, teachers, _images(4, 0), source, labels, PnPGAConfig(members=3))
    loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for s in students for p in s.parameters())
    assert all(p.grad is None for t in teachers for p in t.parameters())
    assert torch.equal(source, source_before) and set(parts) >= {"outlier", "consistency", "source_l1"}


def test_adapt_person_is_deterministic_leaves_its_inputs_and_predicts_with_one_student():
    models = _members(3)
    before = [{k: v.clone() for k, v in m.state_dict().items()} for m in models]
    person, source = _images(5, 2), (_images(6, 3), torch.full((6, 2), 0.1))
    config = PnPGAConfig(members=3, epochs=1)
    a = adapt_person(models, person, source, config, seed=7)
    b = adapt_person(models, person, source, config, seed=7)
    for m, state in zip(models, before):  # the source members are untouched
        assert all(torch.equal(v, state[k]) for k, v in m.state_dict().items())
    x = _images(3, 9)
    with torch.no_grad():
        assert torch.equal(a(x), b(x)) and not torch.equal(a(x), models[2](x))
        assert torch.equal(a(x), a.students[2](x))  # the third student predicts, as the authors' test script
        mean = AdaptedEnsemble(list(a.students), list(a.teachers), None)
        assert torch.allclose(mean(x), torch.stack([s(x) for s in a.students]).mean(0))
    # 5 images and 6 source images in batches of 4: two steps in the one epoch
    assert len(a.losses) == 2 and a.losses == b.losses
    c = adapt_person(models, person, source, config, seed=8)
    with torch.no_grad():
        assert not torch.equal(a(x), c(x))  # another seed, another order of batches
    with pytest.raises(ValueError, match="configured for 3 members"):
        adapt_person(models[:2], person, source, config, seed=0)
    with pytest.raises(ValueError, match="at least 2 ensemble members"):
        PnPGAConfig(members=1).validate()


def test_the_cost_counts_k_models_and_the_source_data():
    models = _members(3)
    per = sum(p.numel() for p in models[0].parameters())
    source = (_images(10, 0), torch.zeros(10, 2))
    cost = adaptation_cost(models, source, PnPGAConfig(members=3), seconds=1.5)
    assert cost.shipped_model_bytes == 3 * per * 4 and cost.training_param_bytes == 5 * 3 * per * 4
    assert cost.shipped_source_bytes == (10 * 3 * 16 * 16 + 10 * 2) * 4 and cost.source_images == 10
    assert cost.inference_params == per and cost.seconds == 1.5
    mean = adaptation_cost(models, source, PnPGAConfig(members=3, predict_with=None), seconds=1.5)
    assert mean.inference_params == 3 * per


def test_snapshot_members_are_the_last_epochs_of_one_training(tmp_path):
    data = open_data("synthetic:eth?persons=3&images_per_person=6&size=16")
    config = TrainConfig(epochs=3, batch_size=8, lr=1e-3, val_fraction=0.34)
    members = train_snapshot_members("tiny_gaze_net", 0, data, None, config, tmp_path / "m", members=2)
    assert [p.name for p in sorted((tmp_path / "m").glob("epoch-*"))] == [
        "epoch-002.safetensors",
        "epoch-003.safetensors",
    ]
    assert len(members) == 2
    trained, _ = load_model(  # the last snapshot is the training's final model
        tmp_path / "m" / "pretrain" / "model.safetensors"
    )
    assert all(torch.equal(a, b) for a, b in zip(members[-1].state_dict().values(), trained.state_dict().values()))
    assert not torch.equal(members[0].fc.weight, members[1].fc.weight)
    again = train_snapshot_members("tiny_gaze_net", 0, data, None, config, tmp_path / "m", members=2)  # read back
    assert torch.equal(again[0].fc.weight, members[0].fc.weight)


def test_below_five_members_an_unadapted_ensemble_has_no_outlier():
    """docs/pnpga.md: among K values the largest z-score is (K − 1)/√K, under the threshold for K ≤ 4."""
    g = torch.Generator().manual_seed(1)
    for k in (2, 3, 4):
        for _ in range(20):
            ensemble = torch.randn(8, 2, k, generator=g, dtype=torch.float64)
            assert float(outlier_loss(ensemble, ensemble, gamma=0.0)) == 0.0
    five = _ensemble([0.0, 0.0, 0.0, 0.0, 1.0])  # the bound, reached: z = 4/√5 = 1.79 > 1.645
    assert float(outlier_loss(five, five, gamma=0.0)) == pytest.approx(4 / 5**0.5)


def test_snapshots_kept_by_the_source_models_own_training_are_those_of_a_training_run_again(tmp_path):
    """The benchmark keeps the ensemble while the source model pre-trains where it can, and trains it apart where
    the source model was cached before: both ways must give the same members, bit for bit."""
    import dataclasses

    from test_gaze_pipeline import FAST, RANK, toy_dataset

    from alfa.checkpoint import save_model
    from alfa.gaze.pipeline import SourceSpec, build_source_model
    from alfa.gaze.pnpga import ensemble_trained, snapshot_paths, snapshot_saver
    from alfa.gaze.train import TruncateConfig, input_size

    pretrain = dataclasses.replace(FAST, epochs=3)
    source = toy_dataset(6, 12, seed=1, name="src")
    spec = SourceSpec("toy:src", None, "tiny_gaze_net", 0, pretrain, TruncateConfig(rank=RANK, recovery=FAST))
    hook = snapshot_saver(tmp_path / "kept", "tiny_gaze_net", 2, pretrain.epochs, input_size(source))
    torch.manual_seed(0)
    built = build_source_model(spec, source, None, cache_dir=tmp_path / "cache", progress=False, on_pretrain_epoch=hook)
    kept = snapshot_paths(tmp_path / "kept", 2, pretrain.epochs)
    assert [p.name for p in kept] == ["epoch-002.safetensors", "epoch-003.safetensors"]
    apart = train_snapshot_members("tiny_gaze_net", 0, source, None, pretrain, tmp_path / "apart", members=2)
    for path, member in zip(kept, apart):
        ours = load_model(path)[0].state_dict()
        assert ours.keys() == member.state_dict().keys()
        assert all(torch.equal(ours[k], member.state_dict()[k]) for k in ours)
    dense = built.dense.state_dict()
    assert all(torch.equal(dense[k], apart[-1].state_dict()[k]) for k in dense)  # the last is the source model
    assert not torch.equal(apart[0].fc.weight, apart[1].fc.weight)
    # finished means every snapshot and a pre-training that says it is complete (its model file is rewritten
    # every epoch: a run stopped between its last snapshot and its checkpoint left one that says it is not)
    assert ensemble_trained(tmp_path / "apart", 2, pretrain.epochs)
    model = tmp_path / "apart" / "pretrain" / "model.safetensors"
    save_model(model, apart[-1], "tiny_gaze_net", extra={"complete": False})
    assert not ensemble_trained(tmp_path / "apart", 2, pretrain.epochs)
    save_model(model, apart[-1], "tiny_gaze_net", extra={"complete": True})
    assert ensemble_trained(tmp_path / "apart", 2, pretrain.epochs)
    snapshot_paths(tmp_path / "apart", 2, pretrain.epochs)[0].rename(tmp_path / "elsewhere.safetensors")
    assert not ensemble_trained(tmp_path / "apart", 2, pretrain.epochs)
