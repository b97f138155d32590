"""The one experiment path of the gaze application: a source model named by its :class:`SourceSpec` (whose cache
key must stay what it was, so existing caches and benchmark records stay valid) and
:func:`personalize_and_score`, which the demo, the benchmark and CRATE's gaze study all reach."""

import dataclasses

import pytest
from test_bench import tiny
from tiny_models import TinyGazeNet  # noqa: F401  (registers tiny_gaze_net)

import alfa
import alfa.gaze.demo_scoring as demo_scoring
import alfa.gaze.pipeline as pipeline
import alfa.study.bench.produce as produce
import alfa.study.crate.gaze as crate_gaze
from alfa.gaze.data.registry import DatasetSpec
from alfa.gaze.personalize import PersonalizeConfig
from alfa.gaze.train import TrainConfig, TruncateConfig
from alfa.study.bench.config import SMOKE_CALIBRATIONS, BenchConfig
from alfa.study.bench.methods import OPT_IN_METHODS
from alfa.study.bench.runner import run_bench

# Fixed stand-ins for the data fingerprints: the key's own inputs are what these literals pin.
FINGERPRINTS = {"source": "0123456789abcdef", "val": "fedcba9876543210"}


@pytest.fixture
def version_0_1_0(monkeypatch):
    """The package version the literal keys were recorded at (the version is part of every key)."""
    monkeypatch.setattr(alfa, "__version__", "0.1.0")


def test_the_demo_source_keys_are_unchanged(version_0_1_0):
    symmetric, studio = pipeline.demo_configs()
    assert pipeline.source_cache_key(symmetric.source_model_spec(), FINGERPRINTS) == "62115526f90a"
    assert pipeline.source_cache_key(studio.source_model_spec(), FINGERPRINTS) == "f0a15e061b27"
    no_val = pipeline.demo_config(val_source=None).source_model_spec()
    assert pipeline.source_cache_key(no_val, FINGERPRINTS) == "6dbdf77a96b1"


@pytest.mark.parametrize(
    ("preset", "source", "seed", "key"),
    [
        ("smoke", "E", 0, "d3a691c80601"),
        ("smoke", "S", 0, "93b89e2e5121"),  # its own training: no symmetry term
        ("smoke", "M", 0, "6aa163556357"),  # a within-target model
        ("quick", "E", 0, "7c6ab130e232"),
        ("first_standard", "C", 1, "78400c4242d8"),  # the preset the first records ran
    ],
)
def test_the_benchmark_source_keys_are_unchanged(version_0_1_0, preset, source, seed, key):
    """On the first worlds (``worlds="v1"``) a preset's source models keep the keys they were cached under."""
    spec = getattr(BenchConfig, preset)(worlds="v1").source_model_spec(source, seed)
    assert pipeline.source_cache_key(spec, FINGERPRINTS) == key


def test_a_model_trained_on_a_gpu_has_a_key_of_its_own(version_0_1_0):
    """A CPU run sharing a cache with a GPU run must not load the GPU's model (other bits than the ones the CPU's
    numbers are pinned to); the CPU keys stay the ones cached before the device counted."""
    import torch

    spec = pipeline.demo_configs()[0].source_model_spec()
    keys = {d: pipeline.source_cache_key(spec, FINGERPRINTS, d) for d in ("cpu", "cuda", "cuda:1", "mps")}
    assert keys["cpu"] == pipeline.source_cache_key(spec, FINGERPRINTS, torch.device("cpu")) == "62115526f90a"
    assert keys["cuda"] == keys["cuda:1"]  # the kind of device, not which one
    assert len({keys["cpu"], keys["cuda"], keys["mps"]}) == 3


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_the_benchmark_and_the_build_name_one_folder_for_a_device(tmp_path, monkeypatch, device):
    """The benchmark finds a model (its refusals, its PnP-GA members, its other ranks) in the folder
    ``build_source_model`` writes it to, on any device (nothing is trained: the build stops at its lock)."""
    import torch

    from alfa.study.bench.session import Session

    config = tiny()
    session = Session(config, tmp_path / "out", tmp_path / "cache", False, torch.device(device))
    src = session.source("E", 0)
    built = []

    def lock(path, on_wait):
        built.append(path)
        raise Reached

    monkeypatch.setattr(pipeline, "locked", lock)
    with pytest.raises(Reached):
        pipeline.build_source_model(src.spec, src.data, src.val, cache_dir=tmp_path / "cache", device=device)
    assert built == [session.source_cache(src)]
    fingerprints = {"source": pipeline.data_fingerprint(src.data), "val": pipeline.data_fingerprint(src.val)}
    assert (src.cache_key == pipeline.source_cache_key(src.spec, fingerprints)) == (device == "cpu")


def test_a_source_spec_takes_dataset_specs_or_their_strings():
    data = DatasetSpec.synthetic("eth", size=32, persons=4, images_per_person=8)
    val = DatasetSpec.synthetic("eth", split="val", size=32, persons=2, images_per_person=4)
    given = {"model": "tiny_gaze_net", "seed": 0, "pretrain": TrainConfig(), "truncation": TruncateConfig()}
    as_specs = pipeline.SourceSpec(data, val, **given)
    as_strings = pipeline.SourceSpec(str(data), str(val), **given)
    assert as_specs == as_strings and as_specs.source == str(data)
    assert pipeline.source_cache_key(as_specs, FINGERPRINTS) == pipeline.source_cache_key(as_strings, FINGERPRINTS)


class Reached(BaseException):
    """Stops an orchestrator at its first shared personalize-and-score call (a BaseException, so that no
    ``except Exception`` of a runner takes it for a failing record)."""


def _stop_at_shared_call(monkeypatch, module):
    calls = []

    def reached(base, data, method, recipe, adapter_folder, **kwargs):
        calls.append((data.name, method.method, kwargs))
        raise Reached

    monkeypatch.setattr(module, "personalize_and_score", reached)
    return calls


@pytest.mark.slow
def test_the_demo_personalizes_through_the_shared_call(tmp_path, monkeypatch):
    calls = _stop_at_shared_call(monkeypatch, demo_scoring)  # where the demo's scoring calls it
    config = pipeline.demo_config(
        source="synthetic:eth?size=32&persons=4&images_per_person=8",
        val_source="synthetic:eth?split=val&size=32&persons=2&images_per_person=4",
        targets=("synthetic:mpii?size=32&persons=2&images_per_person=39",),  # 7, then a pool of 32
        model="tiny_gaze_net",
        pretrain=TrainConfig(epochs=1, batch_size=16),
        truncation=TruncateConfig(rank=4, recovery=TrainConfig(epochs=1, batch_size=16)),
        alfa=alfa.AlfaConfig(heads=2, rank=2),
        personalize=PersonalizeConfig(steps=2),
        out_dir=str(tmp_path / "demo"),
        cache_dir=str(tmp_path / "cache"),
    )
    with pytest.raises(Reached):
        pipeline.run_demo(config, progress=False)
    ((_, method, kwargs),) = calls
    assert method == "alfa" and kwargs["after"] == pipeline.COLUMNS[2]


@pytest.mark.slow
def test_the_benchmark_personalizes_through_the_shared_call(tmp_path, monkeypatch):
    calls = _stop_at_shared_call(monkeypatch, produce)
    with pytest.raises(Reached):
        run_bench(tiny(methods=("lora",)), tmp_path, progress=False)
    ((_, method, kwargs),) = calls
    assert method == "lora" and kwargs["track"] is not None and kwargs["score"] is not None


@pytest.mark.slow
def test_crate_gaze_personalizes_through_the_shared_call(tmp_path, monkeypatch):
    calls = _stop_at_shared_call(monkeypatch, crate_gaze)
    config = dataclasses.replace(crate_gaze.quick_config(), targets=("mpii",), recovery_epochs=0)
    with pytest.raises(Reached):
        crate_gaze.run_crate_gaze(config, tmp_path, progress=False)
    ((_, method, kwargs),) = calls
    assert method == "alfa" and (kwargs["before"], kwargs["after"]) == ("truncated", "alfa")


@pytest.mark.slow
def test_the_smoke_preset_record_hashes_are_unchanged(version_0_1_0, tmp_path, monkeypatch):
    """Every record hash of ``alfa bench --smoke`` on the first worlds with the same persons in every seed (its
    data rendered, nothing trained), as one digest: what the first records were hashed with still holds.

    The data's fingerprint is taken here from its names and person structure, not its pixels: the renderer's
    floating point differs in the last bits between CPUs (AVX-512 and AVX2 builds of the same kernels), which
    changes a pixel fingerprint and every hash built on it while the hashing itself is unchanged; a change of
    what the hash covers still changes the digest."""
    import hashlib
    import json

    import alfa.study.bench.session as session_module
    from alfa.study.bench.plan import plan_records
    from alfa.study.bench.session import Session

    def structure(dataset):
        return hashlib.sha256(json.dumps([dataset.name, len(dataset), dataset.persons()]).encode()).hexdigest()[:16]

    monkeypatch.setattr(session_module, "data_fingerprint", structure)
    config = BenchConfig.smoke(worlds="v1", target_draw="fixed")
    session = Session(config, tmp_path, tmp_path / "cache", progress=False)
    plans = plan_records(config)
    # the loss ablation's rows of the roll objectives and RUDA's rows (issue 26) are new records, and so are the
    # rows the smoke check gained when it came to run every row kind (2026-12-07: PnP-GA, TTA distillation,
    # Alfa's shipped recipe, user calibration); the first 54 hash as they did
    new = {"alfa[loss=roll]|E→M|seed0", "alfa[loss=flip+roll]|E→M|seed0", "ruda|E→M|seed0", "ruda|S→W|seed0"}
    pair_rows = (*OPT_IN_METHODS, "alfa[default]", *SMOKE_CALIBRATIONS)  # the TTA rows: on the v2 worlds only
    new |= {f"{label}|{pair}|seed0" for label in pair_rows for pair in ("E→M", "S→W")}
    assert new <= {p.id for p in plans}
    hashes = [session.record_hash(plan) for plan in plans if plan.id not in new]
    assert len(hashes) == 54
    assert hashlib.sha256(" ".join(hashes).encode()).hexdigest()[:16] == "ec801a1426b4e123"
