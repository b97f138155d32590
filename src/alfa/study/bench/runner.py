"""The cross-domain benchmark (``alfa bench``): every method on four synthetic pairs, seeds, ablations, costs.

The paper's evidence is four tables and two figures on real data; this reproduces their *form* on the
synthetic worlds (spec gaze-data §3). Two sources named like the real ones (``E``: the ETH-XGaze-like
``eth``, ``G``: the Gaze360-like ``gaze360``) and two targets (``M``: ``mpii``, ``D``: ``eyediap``) give
the pairs E→M, E→D, G→M and G→D.

A run has three parts: the plan (:mod:`alfa.study.bench.plan`: which records, in which order), the making
of one record (:mod:`alfa.study.bench.session`: the data and the source models, shared by every method of
a (pair, seed); :mod:`alfa.study.bench.produce`: personalize, score, measure the costs) and the loop here
(:func:`run_bench`: resume, progress, writing).

Records go to ``<out>/results.json``, keyed by a stable id (``"alfa|E→M|seed0"``) and a hash of
everything that determines them (method, recipe, source model, target pixels), so a rerun skips what is
finished and redoes what changed. The file is rewritten atomically (temporary file, then rename) under
a file lock after every record: an interrupted run loses at most the record in progress (whose
per-person adapters resume too), and several pieces of one benchmark (``--seeds 0`` here, ``--seeds 1``
there) may write to the same folder at once.

Nothing is chosen on target labels: every setting is in :class:`~alfa.study.bench.config.BenchConfig`, the
target labels are read only by the evaluation (and by the oracle, which is the headroom, not a competitor).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import platform
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from alfa.adapters import MergeError
from alfa.gaze.pipeline import finished_folder_of_spec, source_model_finished
from alfa.gaze.precision import check_precision, forward_precision
from alfa.study.timing import cpu_kind, cpu_name, load_average, torch_threads

from .config import SELECTION_FIELDS, BenchConfig, split_pair
from .methods import SOURCES
from .plan import RecordPlan, plan_records
from .produce import produce_record
from .record import Record
from .results import ResultsStore
from .session import Session

__all__ = ["BenchSummary", "run_bench", "seed_machine"]


@dataclass
class BenchSummary:
    """What one :func:`run_bench` call did."""

    results: Path
    ran: list[str]
    skipped: list[str]
    pending: list[str]
    wall_s: float
    cpu_s: float
    errors: dict[str, str] = field(default_factory=dict)  # record id -> why it failed (not written)


def _log_line(record: Record, index: int, total: int) -> str:
    spu = record.seconds_per_user
    extra = f", {spu:.1f} s/user" if spu else ""
    failed = f", {len(record.failed)} FAILED" if record.failed else ""
    error = "nan" if record.error_deg is None else f"{record.error_deg:.2f}"
    return (
        f"[{index}/{total}] {record.id}: {error} deg over {record.persons} persons"
        f"{extra}{failed} ({record.wall_s:.0f} s)"
    )


@dataclass
class _RunLog:
    """This run's entry in the results file's log of runs, and what the run has done so far."""

    entry: dict[str, Any]
    session: Session
    t_start: float
    cpu_start: float
    ran: list[str] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)  # record id -> why it failed

    def save(self, data: dict[str, Any], finished: bool = False) -> None:
        """Write the entry (and what the sources' models cost) into the results ``data``."""
        self.entry.update(
            wall_s=time.time() - self.t_start,
            cpu_s=time.process_time() - self.cpu_start,
            records_run=len(self.ran),
            records_failed=self.errors,
            load_average_end=load_average(),
            finished=finished,
        )
        data["runs"] = [r for r in data["runs"] if r.get("id") != self.entry["id"]]
        if self.ran:  # a run that only found finished records adds nothing to the record
            data["runs"].append(dict(self.entry))
        for (key, seed), src in self.session.sources.items():
            if src.info:
                data["sources"][f"{key}|seed{seed}"] = {**data["sources"].get(f"{key}|seed{seed}", {}), **src.info}


def _run_entry(config: BenchConfig, command: str | None, session: Session) -> dict[str, Any]:
    """A new run's entry in the log of runs (its times and counts are filled in as it goes)."""
    # Unique even for two runs of one process within a second (the id only names the run's log entry).
    run_id = f"{datetime.datetime.now().isoformat(timespec='seconds')}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    return {
        "id": run_id,
        "command": command,
        "preset": config.preset,
        "selection": {k: config.to_dict()[k] for k in SELECTION_FIELDS},
        "started": datetime.datetime.now().isoformat(timespec="seconds"),
        "wall_s": 0.0,
        "cpu_s": 0.0,
        "records_run": 0,
        "load_average_start": load_average(),
        "cpus": os.cpu_count(),
        **cpu_kind(),  # a seed's records are made on one kind of machine (docs/gaze.md § Determinism)
        "torch": torch.__version__,
        "python": platform.python_version(),
        "device": str(session.device),
        "precision": session.precision,
        "finished": False,
    }


def _sort_out(
    plans: list[RecordPlan], done: dict[str, str], session: Session
) -> tuple[dict[tuple[int, str], list[RecordPlan]], list[str], list[RecordPlan]]:
    """The plans by (seed, source), the ids of those already in the results with their current hash, and
    the plans still to run (in group order)."""
    groups: dict[tuple[int, str], list[RecordPlan]] = {}
    for plan in plans:
        groups.setdefault((plan.seed, plan.source), []).append(plan)
    skipped: list[str] = []
    todo: list[RecordPlan] = []
    # a record's hash needs its worlds rendered: minutes for a large preset, which --dry-run spent without a line
    bar = tqdm(total=len(plans), desc="records' hashes (their data rendered)", disable=not session.progress)
    for plans_of in groups.values():
        for plan in plans_of:
            if done.get(plan.id) == session.record_hash(plan):
                skipped.append(plan.id)
            else:
                todo.append(plan)
            bar.update(1)
    bar.close()
    return groups, skipped, todo


def _run_records(
    session: Session,
    store: ResultsStore,
    groups: dict[tuple[int, str], list[RecordPlan]],
    todo: list[RecordPlan],
    log: _RunLog,
) -> None:
    """Make the records of ``todo``, one (seed, source) group at a time (its source model built once if a
    record or the rank-slice figure's data use it), writing each as soon as it is made."""
    config, progress = session.config, session.progress
    bar = tqdm(total=len(todo), desc="bench records", disable=not progress, position=0)
    figure_source, figure_target = split_pair(config.figure_pair)
    order = list(groups)
    for index, (seed, source) in enumerate(order):
        group_todo = [p for p in todo if p.seed == seed and p.source == source]
        figure_here = seed == config.figure_seed and source == figure_source and config.figure_pair in config.pairs
        slices_missing = figure_here and not session.figures.has_rank_slices()
        # Built only where a record or the figure uses it: a group of within-target records (whose model is
        # the target's) must not train the pair's source, which another piece of the run may be building.
        if any(session.model_key(p) == source for p in group_todo) or slices_missing:
            ensembles = [p.variant.pnpga.members for p in group_todo if p.variant.pnpga is not None]
            src = session.build(source, seed, pnpga_members=max(ensembles, default=0))
            if figure_here:
                session.figures.save_rank_slices(src, session.target(figure_target, seed))
        for plan in group_todo:
            try:
                record = produce_record(session, plan)
            except (ValueError, RuntimeError, FloatingPointError, OSError, MergeError) as e:
                # One broken record must not stop a run of hours; it is not written, so it reruns next time.
                log.errors[plan.id] = f"{type(e).__name__}: {e}"
                tqdm.write(f"record {plan.id} FAILED ({log.errors[plan.id]}); going on")
                bar.update(1)
                continue
            store.add_record(record)
            log.ran.append(plan.id)
            store.update(log.save)
            bar.update(1)
            if progress:
                tqdm.write(_log_line(record, len(log.ran), len(todo)))
        later = [p for p in todo if (p.seed, p.source) in order[index + 1 :]]
        _release_models(session, (source, seed), group_todo, later)
    bar.close()


def _recorded_model(session: Session, key: str, seed: int) -> str:
    """The cache folder name the results hold for the model ``(key, seed)`` ("" where none is recorded)."""
    return Path(str(session.recorded_sources.get(f"{key}|seed{seed}", {}).get("cache", ""))).name


def _refuse_another_precision_or_device(data: dict[str, Any], session: Session, path: Path) -> None:
    """A run whose forwards use another precision, or another kind of device, than the runs that made a folder's
    records would replace every one of them: their hashes differ and records are kept by id, so a bf16 run into an
    fp32 folder silently turned its finished records into bf16 ones, compared on the page with fp32 rows."""
    made = {
        (run.get("precision", "fp32"), str(run.get("device", "cpu")).split(":")[0])
        for run in data.get("runs", [])
        if isinstance(run, dict) and run.get("records_run")
    }
    here = (session.precision, session.device.type)
    if data.get("records") and made and here not in made:
        theirs = " and ".join(f"{p} on {d}" for p, d in sorted(made))
        raise ValueError(
            f"{path} holds records made in {theirs}; this run ({here[0]} on {here[1]}) would replace them, as "
            "records are kept by id: use another --out"
        )


def _refuse_another_machines_seed(
    todo: list[RecordPlan], session: Session, rebuild_elsewhere: bool = False, new_models_elsewhere: bool = False
) -> None:
    """Refuse, before anything trains, records of a seed whose models the results hold under other cache keys
    than this machine gives them: its data rendered differently here. The worlds are rendered with float
    arithmetic whose last bits depend on the CPU's vector instructions and math library, so another kind of
    machine draws other pixels, trains other models, and its records would sit beside the first machine's as if
    they were one replicate. A seed's records are made on one kind of machine.

    A recorded model whose data this machine renders alike, but which another CPU trained and which this cache
    does not hold, is refused too (:func:`_refuse_training_elsewhere`), unless ``rebuild_elsewhere``.

    A model of the piece the results hold is compared with its record. A seed whose piece only adds models new
    to it (a source or within-target model no record of that seed used yet) is probed with one model the seed's
    records did use: its data rendered here must give the recorded key (one world rendered, no training). A CPU
    can render the worlds alike and still train other bits, so a model new to a seed whose models another CPU
    trained is refused too (:func:`_refuse_training_elsewhere`), unless ``new_models_elsewhere``."""
    models = sorted({(session.model_key(p), p.seed) for p in todo})
    for key, seed in models:
        recorded = _recorded_model(session, key, seed)
        cache = session.source_cache(session.source(key, seed))
        here = cache.name
        if recorded and recorded != here:
            raise ValueError(
                f"{key} seed {seed}'s records were made with the model {recorded}, and its data and recipe give "
                f"{here} here (another kind of CPU renders the worlds differently; or the code that makes the "
                f"model changed); a seed's records are made on one kind of machine: run this piece there, or "
                f"choose another seed"
            )
        if not (rebuild_elsewhere if recorded else new_models_elsewhere):
            _refuse_training_elsewhere(session, key, seed, cache, bool(recorded))
    proven = {seed for key, seed in models if _recorded_model(session, key, seed)}  # compared just above
    for seed in sorted({seed for _, seed in models} - proven):
        suffix = f"|seed{seed}"
        made = [k.removesuffix(suffix) for k in session.recorded_sources if k.endswith(suffix)]
        # a source model's data first: fewer images than a within-target model's
        probes = sorted((k for k in made if _recorded_model(session, k, seed)), key=lambda k: (k not in SOURCES, k))
        if not probes:
            continue  # nothing of this seed was made yet: this machine makes it
        probe, held = probes[0], (probes[0], seed) in session.sources
        here, expected = session.source_cache(session.source(probe, seed)).name, _recorded_model(session, probe, seed)
        if not held:
            session.sources.pop((probe, seed), None)  # its data were rendered for this check alone
        if here != expected:
            raise ValueError(
                f"seed {seed}'s records were made with {probe}'s model {expected}, and "
                f"{probe}'s data and recipe give {here} here (another kind of CPU renders the worlds differently; "
                f"or the code that makes the model changed): this piece's new models would join a seed made on "
                f"another kind of machine; run it there, or choose another seed"
            )


def _refuse_training_elsewhere_unrendered(
    plans: list[RecordPlan], done: dict[str, str], session: Session, rebuild_elsewhere: bool, new_models_elsewhere: bool
) -> None:
    """:func:`_refuse_training_elsewhere`, for the records the results do not hold at all, before any world is
    rendered: a piece run on the wrong kind of machine is refused in seconds rather than after the minutes its
    data take to render. Which folder a model gets here needs its data; the results name the recorded model's, and
    a model new to its seed counts as held where a finished folder in the cache was built from its spec (the
    check after rendering then decides). The rest is refused, or not, after rendering as before."""
    for key, seed in sorted({(session.model_key(p), p.seed) for p in plans if p.id not in done}):
        recorded = _recorded_model(session, key, seed)
        if rebuild_elsewhere if recorded else new_models_elsewhere:
            continue
        spec = session.config.source_model_spec(key, seed)
        cache = session.cache / recorded if recorded else finished_folder_of_spec(session.cache, spec)
        _refuse_training_elsewhere(session, key, seed, cache, bool(recorded))


def _refuse_training_elsewhere(session: Session, key: str, seed: int, cache: Path | None, recorded: bool) -> None:
    """Refuse (``ValueError``) to train here, in ``cache``, a model of ``seed`` that another CPU would be expected to
    train otherwise: the same images train other bits on a CPU with other vector instructions (docs/gaze.md §
    Determinism), and the data probe passes wherever the worlds render alike. ``recorded``: the results hold the
    model (trained on :func:`_trained_on_record`'s CPU), so after its hours of training
    :func:`~alfa.study.bench.session.refuse_a_different_model` would almost surely refuse it
    (``--rebuild-elsewhere`` trains it anyway); else the model is new to the seed, whose models
    :func:`seed_machine`'s CPU trained, and the seed would hold models of two kinds of machine, which neither can
    make again alone (``--new-models-elsewhere`` adds it anyway). A model this cache holds finished is loaded, not
    trained, and a recorded one is compared with its record as ever."""
    made_on, here = _trained_on_record(session, key, seed), cpu_name()  # a new model has no entry: the seed's CPU
    if not made_on or made_on == here or (cache is not None and source_model_finished(cache)):
        return
    if not recorded:
        raise ValueError(
            f"seed {seed}'s models were trained on {made_on}; this machine is {here}, whose vector instructions can "
            f"train other bits from the same images, so {key}'s model, new to the seed, would join it from another "
            f"kind of machine: run this piece on {made_on}, or give --new-models-elsewhere to add it anyway (its "
            f"entry in the results keeps this CPU)"
        )
    started = " (over the unfinished training there)" if cache.exists() else ""
    raise ValueError(
        f"{key} seed {seed}'s records were made with the model {cache.name}, trained on {made_on}; this machine "
        f"is {here}, and a model trained again on another CPU is expected to end elsewhere and be refused after "
        f"its training: run this piece on {made_on}, bring the finished model's folder to {cache}{started}, or "
        f"give --rebuild-elsewhere to train it anyway and let the comparison with its record decide"
    )


def _trained_on_record(session: Session, key: str, seed: int) -> str | None:
    """The CPU the results say trained ``(key, seed)``'s model: its own entry's, else the seed's
    (:func:`seed_machine`)."""
    own = session.recorded_sources.get(f"{key}|seed{seed}", {}).get("cpu")
    return str(own) if own else seed_machine(session.recorded_sources, seed)


def seed_machine(recorded_sources: dict[str, dict[str, Any]], seed: int) -> str | None:
    """The CPU that made ``seed``, from the results' model entries (``results.json``'s ``sources``): the one its
    source models' entries name, else the one all its models' entries name (``None`` where they name none or
    several). The source models first: a within-target model added on another machine (declared, with
    --new-models-elsewhere) does not make the seed's machine unknown."""
    suffix = f"|seed{seed}"
    entries = {k.removesuffix(suffix): e for k, e in recorded_sources.items() if k.endswith(suffix)}
    for keys in ([k for k in entries if k in SOURCES], list(entries)):
        named = {str(entries[k]["cpu"]) for k in keys if entries[k].get("cpu")}
        if named:
            return named.pop() if len(named) == 1 else None
    return None


def _release_models(
    session: Session, group: tuple[str, int], group_todo: list[RecordPlan], later: list[RecordPlan]
) -> None:
    """Free the models a finished group used, its source's and the within-target records' own (the target's),
    except those a later group's records still use: loading one again would log it as loaded from the cache."""
    used = {group} | {(session.model_key(p), p.seed) for p in group_todo}
    needed = {(session.model_key(p), p.seed) for p in later}
    for key, seed in sorted(used - needed):
        session.release(key, seed)


def run_bench(
    config: BenchConfig,
    out_dir: str | os.PathLike,
    *,
    cache_dir: str | os.PathLike | None = None,
    progress: bool = True,
    command: str | None = None,
    dry_run: bool = False,
    device: torch.device | str = "cpu",
    precision: str = "fp32",
    rebuild_elsewhere: bool = False,
    new_models_elsewhere: bool = False,
) -> BenchSummary:
    """Run (or resume) the benchmark described by ``config`` into ``out_dir``.

    Records already in ``out_dir/results.json`` with the same id and config hash are skipped; the others
    run, each written as soon as it is finished. Source models are cached under ``cache_dir`` (default
    ``out_dir/cache``), TPGaze's meta-trained prompts and the other-rank bases next to them. With
    ``dry_run`` nothing is trained: the pending records are listed (the data are rendered to hash them).
    ``device`` holds the models (training and inference); the numbers are compared bit for bit only on the
    CPU, so the run log records the device. ``precision`` is that of the personalization and evaluation
    forwards (:mod:`alfa.gaze.precision`; the source models train in the precision of their recipe, the
    oracle's fine-tuning and the latency timings run in fp32); the run log records it too, and a record
    made in another precision than fp32 is another record, as one made on another device is. A model the
    results hold that another CPU trained is not trained again here unless ``rebuild_elsewhere``, and a model new
    to a seed that another CPU made is not trained here unless ``new_models_elsewhere``.
    """
    config.validate()
    check_precision(precision)
    out = Path(out_dir)
    if not dry_run:
        out.mkdir(parents=True, exist_ok=True)
    cache = Path(cache_dir) if cache_dir is not None else out / "cache"
    store = ResultsStore(out, config, create=not dry_run)
    with torch_threads(config.threads):
        t_start, cpu_start = time.time(), time.process_time()
        # the results' model entries, read once: what each model was when its records were made
        existing = store.read()
        session = Session(config, out, cache, progress, torch.device(device), precision, existing["sources"])
        log = _RunLog(_run_entry(config, command, session), session, t_start, cpu_start)
        plans = plan_records(config)
        _refuse_another_precision_or_device(existing, session, store.path)
        try:
            done = store.done()
            _refuse_training_elsewhere_unrendered(plans, done, session, rebuild_elsewhere, new_models_elsewhere)
            groups, skipped, todo = _sort_out(plans, done, session)
            _refuse_another_machines_seed(todo, session, rebuild_elsewhere, new_models_elsewhere)
            if dry_run:
                return BenchSummary(store.path, [], skipped, [p.id for p in todo], time.time() - t_start, 0.0)
            if progress:
                tqdm.write(f"benchmark {config.preset}: {len(todo)} records to run, {len(skipped)} already done")
            with forward_precision(precision):
                _run_records(session, store, groups, todo, log)
            store.update(lambda data: log.save(data, finished=True))
        finally:
            if not dry_run and log.entry["records_run"] != len(log.ran):  # interrupted: keep what this run did
                with contextlib.suppress(Exception):
                    store.update(log.save)
    pending = [p.id for p in todo if p.id not in log.ran]
    wall, cpu = time.time() - t_start, time.process_time() - cpu_start
    return BenchSummary(store.path, log.ran, skipped, pending, wall, cpu, log.errors)
