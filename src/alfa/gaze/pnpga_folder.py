"""PnP-GA on a dataset of one's own (``alfa pnpga adapt``): the members read from files, one adapted model per
target person written to a folder, each scored on the person's other images beside its unadapted start.

The method is :mod:`alfa.gaze.pnpga`; the benchmark runs it through :mod:`alfa.study.bench.pnpga`. This module is
what a user needs without the benchmark: the ensemble from ``alfa pnpga members`` (or any model files of one
architecture), and a folder that resumes, person by person, and refuses to mix runs of another recipe.

The last member given predicts, as the benchmark declares (docs/pnpga.md): from a members folder, its last epoch,
which is the source model itself, so the ``source-only`` column is the model a user would otherwise deploy.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from torch import Tensor, nn
from tqdm.auto import tqdm

from alfa.checkpoint import load_model, read_checkpoint, save_model
from alfa.fileio import read_kept_json, settings_differences, write_json

from .data.base import GazeDataset, images_differ
from .evaluate import INPUT_SCALING, EvaluationReport, adapter_filename, eval_indices, load_images, person_errors
from .personalize import person_seed
from .pnpga import PnPGAConfig, adapt_person, source_examples
from .train import input_size
from .train_state import MODEL_FILE

__all__ = ["RECORD", "MEMBERS_RECORD", "MembersOfFiles", "check_members_run", "read_members", "adapt_persons"]

RECORD = "pnpga.json"
"""The record of an ``alfa pnpga adapt`` folder: the run's key and, per person, its file and numbers."""

MEMBERS_RECORD = "members.json"
"""The record of an ``alfa pnpga members`` folder: what the training is (model, data, recipe, ``K``), so that a run
of other settings into it is refused rather than handed the snapshots already there, and ``adapt`` reads exactly
its ``K`` snapshots (not those a training of more epochs left)."""

_NOT_THE_RUN = ("num_workers", "eval_batch_size")  # how it is computed, not what: a resume may change them


def check_members_run(out: str | Path, key: dict[str, Any]) -> None:
    """Refuse (``ValueError``) ``out`` where it holds another run's members, an adapt run's models, or snapshots of
    no recorded run; else record ``key`` there (the model, data, recipe and ``K`` of the run about to fill it)."""
    out = Path(out)
    if (out / RECORD).is_file():
        raise ValueError(f"--out {out} holds alfa pnpga adapt's models ({RECORD}): choose another folder")
    mine = {**key, "train_config": {k: v for k, v in key["train_config"].items() if k not in _NOT_THE_RUN}}
    path = out / MEMBERS_RECORD
    if path.is_file():
        theirs = read_kept_json(path)
        if theirs != mine:
            differs = ", ".join(settings_differences(theirs, mine, absent="its default"))  # left out at it
            raise ValueError(
                f"--out {out} holds the members of another run (the folder's vs this run's: {differs}): use another "
                "--out"
            )
        return
    if any(out.glob("epoch-*.safetensors")):
        raise ValueError(f"--out {out} holds snapshots no recorded run made there: use another --out")
    out.mkdir(parents=True, exist_ok=True)
    write_json(path, mine)


@dataclasses.dataclass
class MembersOfFiles:
    """The ensemble read from ``files`` (oldest first; the last predicts), the registered ``model_name`` they
    share, the ``header`` of the last (its input size and pixel scaling, which the data is checked against) and each
    file's tensor ``checksums`` (what a run's key names them by)."""

    models: list[nn.Module]
    files: list[Path]
    model_name: str
    header: dict[str, Any]
    checksums: list[str]


def _snapshots_of(folder: Path) -> list[Path]:
    """A members folder's snapshots: the ``K`` its record names (a training extended to more epochs left earlier
    ones), else every ``epoch-NNN.safetensors`` (a folder the benchmark kept)."""
    from .pnpga import snapshot_paths

    if (folder / MEMBERS_RECORD).is_file():
        record = read_kept_json(folder / MEMBERS_RECORD)
        return [p for p in snapshot_paths(folder, record["members"], record["train_config"]["epochs"]) if p.is_file()]
    return sorted(folder.glob("epoch-*.safetensors"))


def _member_files(paths: Sequence[str | Path]) -> list[Path]:
    files: list[Path] = []
    for given in map(Path, paths):
        if given.is_dir():
            found = _snapshots_of(given)
            if not found:
                raise ValueError(
                    f"--members {given}: no epoch-NNN.safetensors snapshots in it (alfa pnpga members writes them)"
                )
            _refuse_an_unfinished_members_folder(given)
            files += found
        elif given.is_file():
            files.append(given)
        else:
            raise ValueError(f"--members {given}: no such file or folder")
    resolved = [f.resolve() for f in files]
    twice = sorted({str(f) for f in files if resolved.count(f.resolve()) > 1})
    if twice:  # the same model twice is a member with no spread against itself, not a second member
        raise ValueError(f"--members names {twice[0]} more than once")
    return files


def _refuse_an_unfinished_members_folder(folder: Path) -> None:
    """The snapshots of a training stopped part-way are the early epochs only: the model that should predict is
    missing, and nothing in the files says so but the training's own checkpoint beside them."""
    checkpoint = folder / "pretrain" / MODEL_FILE
    if (
        checkpoint.is_file()
        and read_checkpoint(checkpoint, header_only=True)[1].get("extra", {}).get("complete") is False
    ):
        raise ValueError(
            f"--members {folder}: its training stopped before its last epoch; rerun the same alfa pnpga members "
            "command to finish it"
        )


def read_members(paths: Sequence[str | Path]) -> MembersOfFiles:
    """The ensemble of ``paths``: model files, or folders of ``epoch-NNN.safetensors`` snapshots (taken in epoch
    order). At least two, of one registered model, trained on one image size and pixel scaling."""
    files = _member_files(paths)
    if len(files) < 2:
        raise ValueError(f"PnP-GA needs at least 2 ensemble members (a spread to test against), got {len(files)}")
    models, headers = [], []
    for path in files:
        model, header = load_model(path)
        models.append(model.eval())
        headers.append(header)
    for what in ("model", "input_size", "input_scaling", "factorized"):
        values = {repr(h.get(what)) for h in headers}
        if len(values) > 1:
            raise ValueError(f"--members: the files differ in their {what} ({', '.join(sorted(values))}): one model")
    return MembersOfFiles(models, files, headers[-1]["model"], headers[-1], [h.get("checksum") for h in headers])


def _run_key(members: MembersOfFiles, data: GazeDataset, source: str, config: PnPGAConfig, seed: int) -> dict:
    return {
        "members": members.checksums,
        "dataset": data.name,
        "source": source,
        "config": config.to_dict(),
        "seed": seed,
    }


def _record_of(out: Path, key: dict, replace: bool) -> dict:
    """The folder's record, kept where it is this run's (its persons are then skipped), emptied with ``replace``
    (its person files removed), refused otherwise."""
    path = out / RECORD
    if (out / MODEL_FILE).is_file():  # a person named "model" would replace it
        raise ValueError(f"--out {out} holds a model ({MODEL_FILE}): choose another folder")
    if (out / MEMBERS_RECORD).is_file() or any(out.glob("epoch-*.safetensors")):
        raise ValueError(f"--out {out} holds an ensemble's snapshots (alfa pnpga members): choose another folder")
    if not path.is_file():
        return {"key": key, "persons": {}}
    record = read_kept_json(path)
    if not isinstance(record.get("persons"), dict):
        raise ValueError(f"{path} is not a record of alfa pnpga adapt; choose another --out")
    if record.get("key") == key:
        return record
    if not replace:
        theirs = record["key"] if isinstance(record.get("key"), dict) else {}
        differs = sorted(k for k in key if theirs.get(k) != key[k])
        raise ValueError(
            f"--out {out} holds a PnP-GA run of another {', '.join(differs) or 'kind'}: choose another folder, or "
            "pass --replace to remove its models and adapt again"
        )
    for entry in record["persons"].values():
        (out / entry["file"]).unlink(missing_ok=True)
    return {"key": key, "persons": {}}


def adapt_persons(
    members: MembersOfFiles,
    data: GazeDataset,
    source: GazeDataset,
    source_spec: str,
    config: PnPGAConfig,
    out: str | Path,
    *,
    persons: Sequence[str] | None = None,
    seed: int = 0,
    replace: bool = False,
    progress: bool = True,
) -> EvaluationReport:
    """Adapt ``members`` to each of ``persons`` (default: all of ``data``'s) from the person's first
    ``config.images`` images, without their labels, with the first ``config.source_images`` labelled images of
    ``source``; write the predicting student as ``out/<person>.safetensors`` (a whole model: PnP-GA changes
    every weight) and score it, and its unadapted start, on the person's other images. Persons already in
    ``out``'s record by this run are read back, not adapted again; the record is rewritten after each person,
    so a stopped run resumes. Returns the report: columns ``source-only`` and ``pnpga``."""
    out = Path(out)
    key = _run_key(members, data, source_spec, config, seed)
    record = _record_of(out, key, replace)
    record["member_files"] = [str(f) for f in members.files]  # where they were read this time; the key is their sums
    persons = list(data.persons() if persons is None else persons)
    start = members.models[config.predict_with]
    labelled: tuple[Tensor, Tensor] = source_examples(source, config.source_images)
    out.mkdir(parents=True, exist_ok=True)
    size = tuple(members.header.get("input_size") or input_size(data))
    n_eval = {p: len(eval_indices(data, p, config.images)) for p in persons}
    scored = [p for p in persons if n_eval[p] > 0]
    foreign = [
        adapter_filename(p) for p in scored if p not in record["persons"] and (out / adapter_filename(p)).exists()
    ]
    if foreign:  # a file no PnP-GA run there wrote (another user's adapter): not this run's to replace
        raise ValueError(f"--out {out} holds {foreign[0]}, which no PnP-GA run there wrote: choose another folder")
    # the dataset's name alone let another world's numbers through, printed as this run's
    stale = {
        p: why
        for p, done in record["persons"].items()
        if p in n_eval and (why := images_differ(done.get("data"), data, p))
    }
    if stale and not replace:
        person, why = next(iter(stale.items()))
        raise ValueError(
            f"--out {out} holds a PnP-GA run on other images of {person!r} ({why}): choose another folder, or pass "
            "--replace to remove its models and adapt again"
        )
    for person in stale:
        (out / record["persons"].pop(person)["file"]).unlink(missing_ok=True)
    for person in tqdm(scored, desc="pnpga", disable=not progress):
        done = record["persons"].get(person)
        if done is not None and (out / done["file"]).is_file():
            continue  # checked against this data before the loop
        indices = data.person_indices(person)[: config.images]
        ensemble = adapt_person(
            members.models, load_images(data, indices), labelled, config, person_seed(seed, person, "pnpga")
        )
        file = adapter_filename(person)
        about = {"pnpga": {"person": person, "dataset": data.name, "adaptation_images": list(indices), **key}}
        save_model(
            out / file,
            ensemble.predictor,
            members.model_name,
            extra=about,
            input_size=size,
            input_scaling=INPUT_SCALING,
        )
        record["persons"][person] = {
            "file": file,
            "data": data.person_signature(person),
            "seconds": round(ensemble.seconds, 3),
            "loss": [ensemble.losses[0]["loss"], ensemble.losses[-1]["loss"]],
            "before": person_errors(start, data, [person], config.images)[person],
            "after": person_errors(ensemble.predictor, data, [person], config.images)[person],
        }
        write_json(out / RECORD, record)
    report = EvaluationReport(dataset=data.name, n_adapt=config.images, persons=persons, n_eval=n_eval)
    for p in persons:
        if n_eval[p] == 0:
            report.failed[p] = f"fewer than {config.images + 1} images: nothing left to score"
    report.columns["source-only"] = {p: record["persons"][p]["before"] for p in scored}
    report.columns["pnpga"] = {p: record["persons"][p]["after"] for p in scored}
    report.meta.update(pnpga=key, out=str(out))
    return report
