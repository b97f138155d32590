"""What the gaze commands check before they work, and after: the adaptation count ``evaluate`` leaves out, its
column labels and the calibrations its ``--tta`` would undo, what ``alfa personalize`` and ``alfa tpgaze
personalize`` check before adapting anyone (:func:`before_personalizing`), what ``--replace`` may remove, and
whether an evaluation scored everyone. Each raises ``ValueError`` or ``RuntimeError`` with one line for
:func:`alfa.cli.main`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from torch import nn

from .options import comma_list, refuse_listed_twice

__all__ = [
    "adaptation_count",
    "adapted_label",
    "before_evaluating",
    "before_personalizing",
    "check_finished",
    "check_labels",
    "check_method_fits",
    "check_truncatable",
    "check_val_data",
    "load_finished",
    "note_what_serve_refuses",
    "persons_of",
    "prompts_sized_to",
    "raise_if_incomplete",
    "refuse_a_model_that_is_not_a_gaze_model",
    "refuse_a_model_folder_as_users",
    "refuse_adapters_none_fits",
    "refuse_calibrations_under_tta",
    "refuse_foreign_adapters",
    "refuse_n_adapt_no_one_has",
    "refuse_unfinished",
    "remove_listed",
    "tta_column",
]

RESERVED_LABELS = ("source-only",)
"""The column ``evaluate`` always names itself: the base's (with ``--tta KIND`` also ``KIND-TTA``, the base's under
that test-time augmentation)."""


def tta_column(kind: str) -> str:
    """The name of the base's column under test-time augmentation ``kind`` (``flip-TTA``, ``roll-TTA``, ...)."""
    return f"{kind}-TTA"


def adapted_label(adapters: str | None) -> str:
    """The adapted column's default name: ``calibrated`` for a folder ``alfa calibrate`` wrote (its record's method
    is ``calibrate:<method>``), else ``personalized``."""
    from alfa.gaze.folder_record import read_record

    made = read_record(adapters, need_persons=False) if adapters else None
    return "calibrated" if str((made or {}).get("method", "")).startswith("calibrate:") else "personalized"


def check_labels(label: str, tta: str | None) -> None:
    """``--label`` names the adapted column: it may not be empty nor one of the columns ``evaluate`` names itself
    (:data:`RESERVED_LABELS`, and the test-time augmentation's column of ``tta``), whose results it would silently
    replace in the table and the JSON."""
    if not label.strip():
        raise ValueError("--label: the adapted column needs a name")
    taken = RESERVED_LABELS + ((tta_column(tta),) if tta else ())
    if label in taken:
        raise ValueError(f"--label {label!r} is the name of the {label} column already in the report: choose another")


def before_personalizing(
    model: nn.Module, data: Any, persons: list[str] | None, method: Any, config: Any, out: str, replace: bool
) -> None:
    """Every check ``alfa personalize`` and ``alfa tpgaze personalize`` make before adapting anyone, here once so
    that neither command skips one (``tpgaze personalize`` did): the method's sizes fit the model, some person has
    the adaptation images plus one to score (each would fail otherwise), and ``--out`` holds no other run's
    adapters; that one last, since ``--replace`` removes files. A method that trains prompts has them sized to
    the data first (:func:`prompts_sized_to`)."""
    check_method_fits(model, method)
    refuse_n_adapt_no_one_has(data, persons, config.n_adapt)
    refuse_foreign_adapters(model, data, method, config, out, replace)


def prompts_sized_to(data: Any, method: Any, sized_by: str | None) -> Any:
    """``method`` with the prompts of a method that trains them (TPGaze) sized to ``data``'s images, whose size
    they are made for (the config's default, 224, failed every person of other data). ``sized_by``: the option
    that chose the size, kept (``--option image_size=N``; ``--init FILE``/``--meta FILE``, meta-trained prompts)
    and refused in one line naming it where it is not the images'; ``None``: none did. Other methods pass as
    they are."""
    from alfa.gaze.tpgaze import square_image_size

    if not type(method).trains_prompts:
        return method
    size = square_image_size(data, data.person_indices(data.persons()[0])[0])
    if sized_by is None:
        return dataclasses.replace(method, image_size=size)
    if method.image_size != size:
        n = method.image_size
        remedy = (
            f"use --option image_size={size}, or leave it out to size them from the data"
            if sized_by.startswith("--option")
            else "meta-train prompts on images of this size (alfa tpgaze meta-train)"
        )
        raise ValueError(
            f"{sized_by}: TPGaze's prompts are sized for {n}×{n} images, and those of {data.name} are "
            f"{size}×{size}; {remedy}"
        )
    return method


def check_method_fits(model: nn.Module, method: Any) -> None:
    """The method's sizes (rank, heads) fit the layers it will adapt in ``model``: refused at once, before any
    data is read where the command can (:func:`alfa.adapters.select.check_sizes`); a method that adapts no layer
    passes."""
    from alfa.adapters.select import check_sizes

    if getattr(method, "scope", "layer") == "layer":
        check_sizes(model, method)


def refuse_foreign_adapters(model: Any, data: Any, method: Any, config: Any, out: str, replace: bool) -> None:
    """Refuse an ``--out`` that holds adapters another dataset, method, recipe or base made (a run would replace
    them), unless ``--replace``: then remove what the runs there listed, so the new run starts clean."""
    from alfa.gaze.personalize import foreign_adapters

    why = foreign_adapters(model, data, method, config, out)
    if why is None:
        return
    if not replace:
        raise ValueError(f"--out {out}: {why}; use another --out, or --replace to redo them there")
    remove_listed(Path(out))


def persons_of(text: str | None, data: Any) -> list[str] | None:
    """``--persons a,b``: the ids named, or ``None`` (every person) without the option; an option that names
    none (``--persons ,``), or a person ``data`` does not have, is refused before anything is removed or run."""
    if text is None:
        return None
    persons = comma_list(text)
    if not persons:
        raise ValueError(f"--persons {text!r}: name at least one person id (leave the option out for all)")
    refuse_listed_twice("--persons", persons)
    known = set(data.persons())
    unknown = [p for p in persons if p not in known]
    if unknown:
        raise ValueError(f"--persons: {data.name} has no person {', '.join(map(repr, unknown))} (it has {len(known)})")
    return persons


def remove_listed(folder: Path) -> None:
    """``--replace``: remove the files the folder's personalization runs listed (their adapters, sidecars and
    record), nothing else: a file no run there wrote stays, and the run then refuses to replace it."""
    from alfa.gaze.personalize import listed_files

    for name in sorted(listed_files(folder)):
        (folder / name).unlink(missing_ok=True)


def refuse_a_model_folder_as_users(adapters: str | Path) -> None:
    """``--adapters`` naming a model's folder (``alfa pretrain``'s, ``alfa truncate``'s): its model would be taken
    for a user named ``model`` (alfa serve started and answered 404 to that user), so it is one line at once."""
    from alfa.gaze.pnpga_folder import RECORD as PNPGA_RECORD
    from alfa.gaze.train_state import MODEL_FILE

    if (Path(adapters) / MODEL_FILE).is_file():
        raise ValueError(
            f"--adapters {adapters} holds a model ({MODEL_FILE}), not users' files: name the folder alfa personalize "
            "or alfa calibrate wrote (its --out)"
        )
    if (Path(adapters) / PNPGA_RECORD).is_file():  # whole models, which no base takes as adapters
        raise ValueError(
            f"--adapters {adapters} holds PnP-GA's whole models, one per person ({PNPGA_RECORD}), not adapters: alfa "
            "pnpga adapt scored them; alfa predict --checkpoint takes one"
        )


def adaptation_count(args: argparse.Namespace) -> int:
    """How many first images per person ``evaluate`` leaves out: the count the adapters were made from, as
    their folder's ``personalization.json`` records it (a different ``--n-adapt`` would score adaptation
    images, or drop scored ones); ``--n-adapt`` itself, else the recipe's default, when there is no record."""
    from alfa.gaze.folder_record import RECORD_FILE, read_record
    from alfa.gaze.personalize import PersonalizeConfig

    if args.adapters is not None and not Path(args.adapters).is_dir():
        what = "a file, not a folder" if Path(args.adapters).exists() else "no such folder"
        raise FileNotFoundError(
            f"--adapters {args.adapters}: {what} (alfa personalize --out or alfa calibrate --out writes the folder)"
        )
    if args.adapters is not None:
        refuse_a_model_folder_as_users(args.adapters)
    # the recipe is all this reads: a record without persons is taken
    made = read_record(args.adapters, need_persons=False) if args.adapters else None
    if made is None:
        return PersonalizeConfig().n_adapt if args.n_adapt is None else args.n_adapt
    record = Path(args.adapters) / RECORD_FILE
    recipe = made.get("config", {}).get("user_calibration")
    if isinstance(recipe, dict) and recipe.get("every_image") is True:
        raise ValueError(
            f"--adapters {args.adapters}: its calibrations were fitted to every image of each person (alfa calibrate "
            "--k all), so none is left to score; to measure one, calibrate with --k K into another folder"
        )
    if "n_adapt" not in made.get("config", {}):
        raise ValueError(f"{record} is not a personalization record alfa wrote (its config has no n_adapt)")
    made_from = made["config"]["n_adapt"]
    if not isinstance(made_from, int) or isinstance(made_from, bool) or made_from < 1:
        # 0 would score the very images the adapters were made from
        found = json.dumps(made_from) if isinstance(made_from, (int, float, bool)) else type(made_from).__name__
        raise ValueError(
            f"{record}: damaged personalization record (its config's 'n_adapt', the adaptation images per person, "
            f"must be a whole number of at least 1, not {found})"
        )
    if args.n_adapt is not None and args.n_adapt != made_from:
        raise ValueError(
            f"--n-adapt {args.n_adapt}: the adapters in {args.adapters} were made from the first {made_from} "
            "images of each person; leave --n-adapt out to score the others"
        )
    return made_from


def before_evaluating(data: Any, args: argparse.Namespace, n_adapt: int) -> None:
    """What ``evaluate`` refuses in one line once the data is open, where every person would fail alike (a table
    of failures followed): no person with the ``n_adapt`` first images plus one to score (as ``personalize``
    refuses it), or an ``--adapters`` folder with no person's adapter file."""
    from alfa.gaze.evaluate import adapter_filename
    from alfa.gaze.folder_record import RECORD_FILE

    recorded = args.n_adapt is None and args.adapters is not None and (Path(args.adapters) / RECORD_FILE).is_file()
    if recorded:  # the count the adapters were made from (adaptation_count), not the user's to lower
        most = max((len(data.person_indices(p)) for p in data.persons()), default=0)
        if most < n_adapt + 1:
            raise ValueError(
                f"--adapters {args.adapters}: its adapters were made from the first {n_adapt} images of each person, "
                f"and the most any person of {data.name} has is {most}: none left to score (is this their data?)"
            )
    else:  # the user's --n-adapt (or the default): the same bound, with the advice to lower it
        refuse_n_adapt_no_one_has(data, None, n_adapt, "evaluate")
    if args.adapters is not None:
        files = [adapter_filename(p) for p in data.persons()]
        if not any((Path(args.adapters) / name).is_file() for name in files):
            raise FileNotFoundError(
                f"--adapters {args.adapters}: no adapter file of any person of {data.name} (expected names such as "
                f"{files[0]}; alfa personalize --out writes them)"
            )


def refuse_adapters_none_fits(model: nn.Module, data: Any, adapters: str, checkpoint: str) -> None:
    """One line before any scoring where no person's file in ``adapters`` loads onto ``model`` (FAZE calibrations
    given a ResNet: every person failed in turn, after the base's column was scored); where one loads, the others
    are tried when scored, each failure that person's own."""
    import alfa
    from alfa.gaze.evaluate import adapter_filename

    first = None
    for person in data.persons():
        path = Path(adapters) / adapter_filename(person)
        if not path.is_file():
            continue
        try:
            alfa.load_adapter(model, path)
        except (ValueError, RuntimeError, OSError) as e:
            first = first or f"{path.name}: {e}"
            continue
        alfa.detach(model)
        return
    if first is not None:
        raise ValueError(f"--adapters {adapters}: no file there fits --checkpoint {checkpoint} ({first})")


def raise_if_incomplete(report: Any, allow_partial: bool) -> None:
    """An evaluation that could not score every person is an error a script can see (exit 2), unless the user
    accepts it; one that scored nobody always is. Who failed, and why, is said on stderr first (the table on
    stdout marks them ``failed``)."""
    if not report.failed:
        return
    n, total = len(report.failed), len(report.persons)
    alike = _reason_all_share(report.failed)
    if not report.common_persons() and alike is not None:  # one line, not one a person (adapters of other data)
        raise RuntimeError(f"no person could be scored ({n} of {total} failed, each alike; the first, {alike})")
    for line in report.failure_lines():
        print(line, file=sys.stderr)
    if not report.common_persons():
        raise RuntimeError(f"no person could be scored ({n} of {total} failed, listed above)")
    if not allow_partial:
        raise RuntimeError(
            f"{n} of {total} persons could not be scored (listed above; the means leave them out); "
            "--allow-partial accepts that"
        )


def _reason_all_share(failed: dict[str, str]) -> str | None:
    """``person: why`` of the first failed person, where two or more failed and their reasons differ only by whose
    they are (each names its own person); ``None`` otherwise."""
    shapes = {why.replace(person, "\0") for person, why in failed.items()}
    if len(failed) < 2 or len(shapes) != 1:
        return None
    first = next(iter(failed))
    return f"{first}: {failed[first]}"


def refuse_n_adapt_no_one_has(data: Any, persons: list[str] | None, n_adapt: int, work: str = "personalize") -> None:
    """One line before any work where no person has the adaptation images plus one to score (each would fail);
    ``work``: what they would be too few to do."""
    most = max((len(data.person_indices(p)) for p in persons or data.persons()), default=0)
    if most < n_adapt + 1:
        advice = f"use --n-adapt {most - 1} or less" if most >= 2 else f"no person has enough images to {work}"
        raise ValueError(
            f"--n-adapt {n_adapt}: a person needs those first images plus at least one to score, and the most any "
            f"person of {data.name} has is {most}; {advice}"
        )


def note_what_serve_refuses(model: nn.Module, command: str, method: str, checkpoint: str, besides: str = "") -> None:
    """Files ``alfa serve`` will refuse: a method's that change the shared base (DoRA, PiSSA, MiLoRA; whole-model
    and prompt methods), or, on an untruncated base, any layer method's (it adapts dense layers: files and time many
    times a truncated base's). It works, so it is said once, up front, where it can still be changed (after every
    refusal: a refused run prints one line). ``besides``: what else the command offers."""
    from alfa.adapters import METHODS
    from alfa.layers import is_factorized
    from alfa.serve import serve_refusal

    cls = METHODS[method]
    refusal = serve_refusal(cls)
    if refusal is not None:  # truncating would not help: said first, and alone
        served = [name for name, c in METHODS.items() if serve_refusal(c) is None and name != "correction"]
        print(
            f"alfa {command}: note: alfa serve refuses the {method} adapters this writes ({refusal}); for alfa serve "
            f"adapt with a method it serves: {', '.join(served)}{besides}",
            file=sys.stderr,
        )
    elif not cls.trains_prompts and not any(map(is_factorized, model.modules())):
        print(
            f"alfa {command}: note: {checkpoint} is not truncated, so each person's {method} adapter adapts "
            f"dense layers: large files, slow to make, that alfa serve refuses (alfa truncate the base first{besides})",
            file=sys.stderr,
        )


def refuse_calibrations_under_tta(tta: Any, folder: Path) -> None:
    """``--tta`` scores no labelled calibration in ``folder`` (:meth:`alfa.gaze.tta.TTAKind.refuse_calibration`); a
    file whose header does not read is left to the scoring, which lists it as failed."""
    from alfa.adapters import read_adapter_metadata

    for path in sorted(folder.glob("*.safetensors")):
        try:
            about = read_adapter_metadata(path).get("about") or {}
        except (ValueError, OSError):
            continue
        tta.refuse_calibration(about, str(path))


_TRAINED_BY = {"pretrain": "alfa pretrain", "recover": "alfa truncate"}
"""Per training stage a checkpoint's header records, the command that writes it (and resumes it)."""


def refuse_unfinished(path: Any, saved: dict[str, Any]) -> None:
    """A checkpoint a training run rewrites after every epoch says ``"complete": false`` in its header until the
    last: one the run was stopped before is refused in one line, how far it got and how to finish it (rerunning the
    same command resumes it). Files without the flag (finished runs, other writers) pass."""
    extra = saved.get("extra")
    if not isinstance(extra, dict) or extra.get("complete") is not False:
        return
    command = _TRAINED_BY.get(extra.get("stage"), "the training command that wrote it")
    epochs = (extra.get("train_config") or {}).get("epochs")
    got = f"epoch {extra.get('epoch', '?')} of {epochs}" if epochs else f"epoch {extra.get('epoch', '?')}"
    raise ValueError(
        f"{path} is unfinished: its training stopped after {got}; rerun the same {command} command (same --out) "
        "to resume and finish it, then use the model it completes"
    )


def load_finished(path: str) -> tuple[nn.Module, dict[str, Any]]:
    """:func:`alfa.checkpoint.load_model` for a command's ``--checkpoint``, refusing an unfinished training's
    model (:func:`refuse_unfinished`) before its weights are read."""
    from alfa.checkpoint import load_model

    check_finished(path)
    return load_model(path)


def check_finished(path: str) -> None:
    """Refuse the checkpoint at ``path`` if its header says its training is unfinished (:func:`refuse_unfinished`);
    reading only the header."""
    from alfa.checkpoint import read_checkpoint

    refuse_unfinished(path, read_checkpoint(path, header_only=True)[1])


def check_truncatable(model: nn.Module, rank: int) -> None:
    """``alfa truncate --rank``: refused at once where no layer of ``model`` would be truncated with a saving (the
    structure alone, on a copy: no SVD is taken), not after the data is made and the dense model scored.

    A check changes nothing of its caller's: building the copy's empty factorized layers draws their initial
    values from torch's global generators, whose states are put back afterwards (the CPU's, and those of the
    GPUs the model is on)."""
    import copy

    import torch

    from alfa.truncate import truncate

    gpus = sorted({p.device.index for p in model.parameters() if p.device.type == "cuda"})
    with torch.random.fork_rng(devices=gpus):
        truncate(copy.deepcopy(model), rank, weights=False)


def check_val_data(args: argparse.Namespace) -> None:
    """``--val-data``, refused in one line before any data is made or read (the training data is opened first:
    minutes of rendering or reading at real sizes, then the refusal): an empty value (an unset shell variable,
    which was taken as no option), a spec whose form, kind, options, world or folder is wrong
    (:func:`alfa.gaze.data.registry.check_spec`), or ``--data``'s own spec however written
    (:func:`alfa.gaze.data.registry.canonical_spec`), whose persons every epoch trains on."""
    from alfa.gaze import photo_data  # noqa: F401  (registers photos:, as alfa.gaze.pipeline.open_data does)
    from alfa.gaze.data.registry import canonical_spec, check_spec

    spec = args.val_data
    if spec is None:
        return
    if not spec.strip():
        raise ValueError("--val-data is empty: name a dataset spec, or leave the option out")
    try:
        check_spec(spec)
    except ValueError as e:
        raise ValueError(f"--val-data: {e}") from e
    try:  # read alike: the same data however written (an alias, the kind's case, the options' order)
        same = canonical_spec(spec) == canonical_spec(args.data)
    except ValueError:  # --data's errors are its own opening's
        same = False
    if same:
        raise ValueError(
            f"--val-data {spec} is --data itself: its persons are trained on; validate on another split (a synthetic "
            "world's ?split=val), or leave --val-data out to hold persons out"
        )


def refuse_a_model_that_is_not_a_gaze_model(
    model: nn.Module, name: str, data: Any, uses: str = "alfa pretrain trains", image: Any = None
) -> None:
    """Before any work: ``model`` must take the data's images (or ``image``, one ``(1, 3, H, W)`` batch, where there
    is no data) and predict (yaw, pitch) for each (an image classifier of the registry, vit_tiny's 1,000 classes,
    failed after the data loaded, or, in alfa costs, after the model was truncated). ``uses``: what the command does
    with one, for the message."""
    import torch

    from alfa.gaze.data.base import unit_images

    if image is None:
        if len(data) == 0:  # said by the training itself
            return
        image = unit_images(data.raw_images([0]))
    image = image.to(next(model.parameters()).device)
    try:
        with torch.no_grad():
            shape = tuple(model.eval()(image).shape)
        what = f"it gives {shape[1:]} for an image" if shape != (1, 2) else None
    except (RuntimeError, ValueError, AssertionError) as e:
        what = f"it cannot take {image.shape[2]}×{image.shape[3]} images: {str(e).splitlines()[0]}"
    model.train()
    if what is not None:
        raise ValueError(
            f"--model {name} is not a gaze model for these images ({what}): {uses} one that predicts (yaw, pitch) "
            "from a face crop, such as resnet18_gaze"
        )
