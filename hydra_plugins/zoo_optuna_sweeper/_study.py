"""What the zoo_optuna sweeper does with Optuna: the study, the sweep loop, and the trial a job
reports to (the search space is in _space.py). Imported only when a sweep or a trial runs (the
leading underscore keeps Hydra's plugin scan from importing it at every start)."""

from __future__ import annotations

import functools
import logging
import math
import os
import socket
import sys
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy
from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext
from omegaconf import DictConfig, OmegaConf
from optuna.trial import TrialState

from hydra_plugins.zoo_optuna_sweeper._files import SweepError, read_yaml, storage_error
from hydra_plugins.zoo_optuna_sweeper._names import (
    ERROR,
    INTERRUPTED,
    JOB_DIR,
    OWNER,
    PRUNER,
    RESULTS,
    RETRY_OF,
)
from hydra_plugins.zoo_optuna_sweeper._space import SearchSpace
from tasks.errors import EndedOnPurpose

log = logging.getLogger(__name__)

SAMPLERS = ("tpe", "random", "grid")
PRUNERS = {
    "median": "MedianPruner",
    "percentile": "PercentilePruner",
    "successive_halving": "SuccessiveHalvingPruner",
    "hyperband": "HyperbandPruner",
    "threshold": "ThresholdPruner",
    "none": "NopPruner",
}
DIRECTIONS = {"minimize": "minimize", "min": "minimize", "maximize": "maximize", "max": "maximize"}


@functools.cache
def open_storage(url: str) -> optuna.storages.BaseStorage:
    """One storage per URL and process (jobs of the basic launcher run in the sweep's process). One
    that cannot be opened (a file that is no database, a truncated one, a folder it cannot be made
    in, a missing driver, an Optuna too old or new for its tables) is a SweepError naming it."""
    engine_kwargs = {"connect_args": {"timeout": 60}} if url.startswith("sqlite:") else None
    try:
        if url.startswith("sqlite:///"):
            Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
        return optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs)
    except (sqlalchemy.exc.SQLAlchemyError, OSError, ImportError, RuntimeError) as error:
        raise storage_error(url, error) from None


def make_pruner(name: str, args: Mapping[str, Any]) -> optuna.pruners.BasePruner:
    if name not in PRUNERS:
        raise SweepError(f"hydra.sweeper.pruner={name!r}; choose one of {sorted(PRUNERS)}")
    cls = getattr(optuna.pruners, PRUNERS[name])
    try:
        return cls(**args)
    except TypeError as error:  # arguments meant for another pruner, e.g. left by an hparams_search file
        drop = " ".join(f"~hydra.sweeper.pruner_args.{key}" for key in args)
        raise SweepError(
            f"hydra.sweeper.pruner_args={dict(args)} do not fit {cls.__name__} ({error}); drop them "
            f"({drop}) and add its own (+hydra.sweeper.pruner_args.<name>=<value>)"
        ) from None


def open_trial(storage_url: str, study_name: str, number: int) -> optuna.trial.Trial:
    """The running trial ``number`` of a study, as a job sees it: reports go to the storage and
    ``should_prune`` asks the pruner the sweep recorded in the study."""
    storage = open_storage(storage_url)
    study_id = storage.get_study_id_from_name(study_name)
    spec = storage.get_study_user_attrs(study_id).get(PRUNER, {"name": "none", "args": {}})
    study = optuna.load_study(study_name=study_name, storage=storage, pruner=make_pruner(spec["name"], spec["args"]))
    return optuna.trial.Trial(study, storage.get_trial_id_from_study_id_trial_number(study_id, number))


class Pruned(optuna.TrialPruned, EndedOnPurpose):
    """The trial was pruned (the sweeper records it as PRUNED). No crash, so the run leaves no
    on_exception.ckpt (see tasks.run.callbacks.CrashCheckpoint)."""


class PrunedOnARankAbove0(Pruned):
    """The trial was pruned, seen from a DDP process that Lightning started for a trial's job: the
    job's own process (rank 0) tells the sweeper. ``exit_quietly``: the verb ends this process
    cleanly (see tasks.errors.RAISE_ERRORS_ENV), as Lightning kills the job's process when one
    of the processes it started fails."""

    exit_quietly = True


class OptunaSweep:
    """One run of the sweeper: open (or resume) the study, then launch batches until n_trials are done."""

    def __init__(
        self, options: Mapping[str, Any], config: DictConfig, hydra_context: HydraContext, launcher: Launcher
    ) -> None:
        self.options, self.config, self.hydra_context, self.launcher = dict(options), config, hydra_context, launcher
        self.sweep_dir = Path(str(config.hydra.sweep.dir))
        self.owner = f"{socket.gethostname()}:{os.getpid()}"

    def run(self, arguments: list[str]) -> list[JobReturn]:
        """The sweep; what keeps it from starting or going on (an option, the sweep directory, the
        storage) ends the process with one line and exit status 2."""
        try:
            return self.sweep(arguments)
        except SweepError as error:
            end(error)
        except sqlalchemy.exc.SQLAlchemyError as error:  # the storage failed during the sweep (a full disk...)
            end(storage_error(self.storage_url, error))
        except OSError as error:
            if not error.filename:
                raise
            end(SweepError(f"cannot write {error.filename}: {error.strerror}; choose a hydra.sweep.dir you can write"))

    def sweep(self, arguments: list[str]) -> list[JobReturn]:
        space = SearchSpace.parse(self.options.get("params"), arguments, self.hydra_context.config_loader)
        if not space.params:
            raise SweepError("nothing to search: set hydra.sweeper.params (or sweep on the command line, x=1,2)")
        n_trials = self.options["n_trials"]
        if self.options["sampler"] == "grid":
            n_trials = min(n_trials, math.prod(len(v) for v in space.grid().values()))
        self.check_sweep_dir(self.study_name(space))
        study = self.open_study(space)
        self.sweep_dir.mkdir(parents=True, exist_ok=True)
        self.write_results(study, n_trials)  # first: a folder holding anything of a sweep says whose it is
        OmegaConf.save(self.config, self.sweep_dir / "multirun.yaml")
        done = finished(study)
        log.info(
            f"Optuna study {study.study_name} in {self.storage_url}: {done} of {n_trials} trials finished "
            f"({study.direction.name.lower()} {self.metric or 'the return value'}), "
            f"{len(space.params)} params: {', '.join(space.params)}"
        )
        returns: list[JobReturn] = []
        while done < n_trials:
            batch = [study.ask(space.distributions()) for _ in range(min(self.options["n_jobs"], n_trials - done))]
            for trial in batch:
                trial.set_user_attr(OWNER, self.owner)
            try:
                returns.extend(self.launch(study, space, batch))
            except BaseException:  # Ctrl-C, a job's sys.exit: let the next run retry these trials
                self.interrupted(study, [t.number for t in batch])
                raise
            done = finished(study)
            self.write_results(study, n_trials)
        self.write_results(study, n_trials)
        end_if_all_failed(study)
        return returns

    @property
    def storage_url(self) -> str:
        url = self.options.get("storage")
        if url is None:
            return f"sqlite:///{(self.sweep_dir.parent / 'optuna.db').resolve()}"
        if url.startswith("sqlite:///") and not url.startswith("sqlite:////"):  # relative: make it the same for jobs
            return f"sqlite:///{Path(url.removeprefix('sqlite:///')).resolve()}"
        return url

    @property
    def metric(self) -> str | None:
        return OmegaConf.select(self.config, "monitor.metric", default=None)

    def study_name(self, space: SearchSpace) -> str:
        return self.options.get("study_name") or (
            f"{OmegaConf.select(self.config, 'task_name', default=self.config.hydra.job.name)}-{space.digest()}"
        )

    def open_study(self, space: SearchSpace) -> optuna.Study:
        direction = self.options.get("direction") or {"max": "maximize"}.get(
            OmegaConf.select(self.config, "monitor.mode", default="min"), "minimize"
        )
        if direction not in DIRECTIONS:
            raise SweepError(f"hydra.sweeper.direction={direction!r}; choose minimize or maximize")
        pruner_spec = {"name": self.options["pruner"], "args": self.options.get("pruner_args") or {}}
        pruner = make_pruner(pruner_spec["name"], pruner_spec["args"])
        self.make_sampler(space, n_before=0)  # a bad sampler option fails before the storage holds a study
        name, storage = self.study_name(space), open_storage(self.storage_url)
        study = optuna.create_study(
            storage=storage, study_name=name, direction=DIRECTIONS[direction], load_if_exists=True
        )
        study.set_user_attr(PRUNER, pruner_spec)
        self.recover_stale_trials(study)
        return optuna.load_study(
            study_name=name,
            storage=storage,
            pruner=pruner,
            sampler=self.make_sampler(space, n_before=len(study.trials)),
        )

    def check_sweep_dir(self, study_name: str) -> None:
        """The sweep directory must be new, empty, or this study's own (the same command run again with
        the same hydra.sweep.dir): job folders are named by trial numbers, which another study starts
        again from 0, so its folders would be written over."""
        if not self.sweep_dir.is_dir() or not any(self.sweep_dir.iterdir()):
            return
        results, fix = self.sweep_dir / RESULTS, "choose a new hydra.sweep.dir (by default each sweep gets a fresh one)"
        if not results.is_file():
            raise SweepError(
                f"hydra.sweep.dir={self.sweep_dir} is not empty and holds no {RESULTS}: it is no "
                f"sweep's folder, and jobs would write into it; {fix}"
            )
        found = read_yaml(results, f"repair it or {fix}")
        found = found if isinstance(found, dict) else {}
        if (found.get("study_name"), found.get("storage")) != (study_name, self.storage_url):
            raise SweepError(
                f"hydra.sweep.dir={self.sweep_dir} holds the jobs of another sweep ({results} names "
                f"study {found.get('study_name')!r} in {found.get('storage')!r}, this one is "
                f"{study_name!r} in {self.storage_url}); {fix}"
            )

    def make_sampler(self, space: SearchSpace, n_before: int) -> optuna.samplers.BaseSampler:
        name, args = self.options["sampler"], dict(self.options.get("sampler_args") or {})
        if name not in SAMPLERS:
            raise SweepError(f"hydra.sweeper.sampler={name!r}; choose one of {list(SAMPLERS)}")
        seed = self.options.get("seed")
        if seed is not None:
            args["seed"] = seed + n_before
        try:
            if name == "grid":
                return AskTellGridSampler(space.grid(), **args)
            return (optuna.samplers.TPESampler if name == "tpe" else optuna.samplers.RandomSampler)(**args)
        except TypeError as error:  # arguments meant for another sampler, e.g. left by an hparams_search file
            drop = " ".join(f"~hydra.sweeper.sampler_args.{key}" for key in self.options.get("sampler_args") or {})
            raise SweepError(
                f"hydra.sweeper.sampler_args do not fit sampler={name} ({error}); drop them ({drop})"
            ) from None

    def recover_stale_trials(self, study: optuna.Study) -> None:
        """Trials a killed sweep left RUNNING: mark them failed (not counted) and queue their params
        again. A trial whose sweep process is still alive on this host is left alone."""
        stale = [
            t
            for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
            if not alive(t.user_attrs.get(OWNER, ""))
        ]
        if stale:
            log.info(
                f"Retrying {len(stale)} trial(s) an interrupted sweep left running: "
                f"{', '.join(str(t.number) for t in stale)}"
            )
            self.interrupted(study, [t.number for t in stale])

    @staticmethod
    def interrupted(study: optuna.Study, numbers: list[int]) -> None:
        trials = {t.number: t for t in study.get_trials(deepcopy=False)}
        numbers = [n for n in numbers if trials[n].state == TrialState.RUNNING]
        study.set_user_attr(INTERRUPTED, sorted({*study.user_attrs.get(INTERRUPTED, []), *numbers}))
        for number in numbers:
            study.tell(number, state=TrialState.FAIL, skip_if_finished=True)
            study.enqueue_trial(trials[number].params, user_attrs={RETRY_OF: number})

    def launch(self, study: optuna.Study, space: SearchSpace, batch: list[optuna.trial.Trial]) -> list[JobReturn]:
        """Launch the batch's trials and tell Optuna how each ended. A job's number is its trial's
        (its folder is ``<sweep dir>/<trial number>``, and callbacks.TrialOfTheJob finds the trial by
        it): trials with consecutive numbers launch together, a gap (a trial that did not compose)
        starts another launch."""
        legal: list[tuple[optuna.trial.Trial, list[str]]] = []
        for trial in batch:
            job = list(space.overrides(trial.params))
            try:
                self.hydra_context.config_loader.load_sweep_config(self.config, job)  # does it compose?
                legal.append((trial, job))
            except Exception as error:  # e.g. a typed config field refusing a sampled value
                fail(study, trial, error)
        returns: list[JobReturn] = []
        for run in consecutive(legal):
            done = list(self.launcher.launch([job for _, job in run], initial_job_idx=run[0][0].number))
            for (trial, _), job_return in zip(run, done, strict=True):
                tell(study, trial, job_return)
            returns.extend(done)
        return returns

    def write_results(self, study: optuna.Study, n_trials: int) -> None:
        """optimization_results.yaml in the sweep directory: the study, its best trial, counts by state."""
        trials = study.get_trials(deepcopy=False)
        counts = {state.name: sum(t.state == state for t in trials) for state in TrialState}
        results: dict[str, Any] = {
            "name": "zoo_optuna",
            "study_name": study.study_name,
            "storage": self.storage_url,
            "direction": study.direction.name.lower(),
            "metric": self.metric,
            "n_trials": n_trials,
            "trials": {k: v for k, v in counts.items() if v},
        }
        if counts["COMPLETE"]:
            best = study.best_trial
            results.update(best_trial=best.number, best_value=best.value, best_params=best.params)
        OmegaConf.save(OmegaConf.create(results), self.sweep_dir / RESULTS)


class AskTellGridSampler(optuna.samplers.GridSampler):
    """GridSampler without its ``study.stop()`` once the grid is done, which works only inside
    ``study.optimize``; the sweep stops itself at n_trials, capped at the size of the grid."""

    def after_trial(
        self, study: optuna.Study, trial: optuna.trial.FrozenTrial, state: TrialState, values: Sequence[float] | None
    ) -> None:
        pass


def consecutive(trials: list[tuple[optuna.trial.Trial, list[str]]]) -> list[list[tuple[optuna.trial.Trial, list[str]]]]:
    """``trials`` cut where their numbers are not consecutive."""
    runs: list[list[tuple[optuna.trial.Trial, list[str]]]] = []
    for item in trials:
        if runs and runs[-1][-1][0].number + 1 == item[0].number:
            runs[-1].append(item)
        else:
            runs.append([item])
    return runs


def end(error: SweepError) -> typing.NoReturn:
    print(f"zoo: SweepError: {error}", file=sys.stderr)
    sys.exit(2)


def finished(study: optuna.Study) -> int:
    """Trials that count toward n_trials: complete, pruned, or failed by their own error (not by a kill)."""
    interrupted = set(study.user_attrs.get(INTERRUPTED, []))
    return sum(
        t.state in (TrialState.COMPLETE, TrialState.PRUNED)
        or (t.state == TrialState.FAIL and t.number not in interrupted)
        for t in study.get_trials(deepcopy=False)
    )


def end_if_all_failed(study: optuna.Study) -> None:
    """A sweep none of whose trials completed ends with exit status 1 and the first trial's error,
    in one line (not as a success: a sweep that learned nothing must not look like one)."""
    trials = study.get_trials(deepcopy=False)
    if not trials or any(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in trials):
        return
    first = next((t.user_attrs[ERROR] for t in trials if t.user_attrs.get(ERROR)), "no error recorded")
    print(
        f"zoo: SweepError: all {len(trials)} trials of study {study.study_name} failed; the first: {first}",
        file=sys.stderr,
    )
    sys.exit(1)


def tell(study: optuna.Study, trial: optuna.trial.Trial, job: JobReturn) -> None:
    if job.hydra_cfg is not None:
        trial.set_user_attr(JOB_DIR, str(job.hydra_cfg.hydra.runtime.output_dir))
    try:
        value = job.return_value
    except optuna.TrialPruned as pruned:
        log.info(f"Trial {trial.number} pruned: {pruned}")
        study.tell(trial, state=TrialState.PRUNED)
        return
    except Exception as error:
        fail(study, trial, error)
        return
    if not isinstance(value, (int, float)) or math.isnan(value):
        fail(study, trial, ValueError(f"the job returned {value!r}, not the monitored metric"))
        return
    study.tell(trial, float(value))


def fail(study: optuna.Study, trial: optuna.trial.Trial, error: BaseException) -> None:
    log.warning(f"Trial {trial.number} failed: {type(error).__name__}: {error}")
    trial.set_user_attr(ERROR, f"{type(error).__name__}: {error}"[:1000])
    study.tell(trial, state=TrialState.FAIL)


def alive(owner: str) -> bool:
    """Whether "host:pid" is a live process other than this one, on this host."""
    host, _, pid = owner.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit() or int(pid) == os.getpid():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
