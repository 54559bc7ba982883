"""zoo-sweep-report: a markdown table and one plot per swept parameter for a ``zoo-train -m`` directory.

Reads a grid multirun (each job's ``.hydra/overrides.yaml``, ``config.yaml`` and ``logs/metrics.csv``)
or an Optuna sweep of ``hydra/sweeper=zoo_optuna`` (``optimization_results.yaml`` names the study,
whose trials, resumed runs included, are read from its storage: read-only, and only a storage that
exists; the report never creates one). Writes ``sweep_report.md`` and
``sweep_<param>.png`` into the directory and prints the table::

    zoo-sweep-report outputs/gpt_generator/multiruns/2026-11-29_14-00-00

(also ``python -m hydra_plugins.zoo_optuna_sweeper.report``). It lives with the sweeper, whose trial
attributes it reads by the names in ``_names``; the figures are drawn in ``_figures``.
"""

# No `from __future__ import annotations` here: Hydra's plugin scan runs this module (its name has no
# leading underscore) before it is in sys.modules, where dataclasses cannot resolve string annotations.
import argparse
import math
import sys
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from hydra_plugins.zoo_optuna_sweeper._figures import plot
from hydra_plugins.zoo_optuna_sweeper._files import (
    SweepError,
    first_line,
    job_config,
    job_overrides,
    logged,
    monitor_of,
    read_yaml,
    setting,
)
from hydra_plugins.zoo_optuna_sweeper._names import ERROR, JOB_DIR, RESULTS, RETRY_OF

REPORT = "sweep_report.md"


class NotASweep(SweepError):
    """The directory is not the output of ``zoo-train -m``."""


@dataclass
class Trial:
    """One job of the sweep: its swept values, the monitored metric and how it ended."""

    number: int
    params: dict[str, Any]
    value: float | None  # the monitored metric at the end (a pruned trial: its last report)
    state: str  # COMPLETE, PRUNED, FAIL, RUNNING, WAITING (Optuna); COMPLETE, INCOMPLETE, NO METRIC (grid)
    best: float | None = None  # the best logged value over the run, from its metrics.csv
    job_dir: Path | None = None
    note: str = ""  # why an Optuna trial failed


@dataclass
class Sweep:
    path: Path
    metric: str
    mode: str  # "min" or "max"
    trials: list[Trial]
    fixed: list[str] = field(default_factory=list)  # overrides every job had
    log_params: set[str] = field(default_factory=set)  # searched on a log scale
    categorical: set[str] = field(default_factory=set)  # searched as choices (plotted per value, numbers too)
    header: str = ""

    @property
    def params(self) -> list[str]:
        return list(dict.fromkeys(name for t in self.trials for name in t.params))

    def best_trial(self) -> Trial | None:
        done = [t for t in self.trials if t.state == "COMPLETE" and t.value is not None]
        if not done:
            return None
        return (min if self.mode == "min" else max)(done, key=lambda t: t.value)


def read_sweep(path: Path) -> Sweep:
    if not path.is_dir():
        raise NotASweep(f"{path} is not a directory")
    if (path / RESULTS).is_file():
        fix = f"repair it, or move it out of {path} to report the jobs as a grid"
        results = read_yaml(path / RESULTS, fix)
        texts = ("study_name", "storage", "metric")
        if not isinstance(results, dict) or not all(isinstance(results.get(k), str | None) for k in texts):
            raise SweepError(
                f"{path / RESULTS} is not the mapping the sweeper writes ({', '.join(texts)}: text); {fix}"
            )
        if results.get("study_name") and results.get("storage"):
            return read_optuna(path, results)
    jobs = job_dirs(path)
    if not jobs:
        hint = " (it holds a single run)" if (path / ".hydra").is_dir() else ""
        raise NotASweep(
            f"{path} is not a multirun directory: no <job>/.hydra/overrides.yaml and no "
            f"optimization_results.yaml{hint}; pass what `zoo-train -m` printed, e.g. "
            f"outputs/<task_name>/multiruns/<date>"
        )
    return read_grid(path, jobs)


def job_dirs(path: Path) -> list[Path]:
    jobs = [d for d in path.iterdir() if (d / ".hydra" / "overrides.yaml").is_file()]
    return sorted(jobs, key=lambda d: (not d.name.isdigit(), int(d.name) if d.name.isdigit() else 0, d.name))


def read_grid(path: Path, jobs: list[Path]) -> Sweep:
    overrides = {job: job_overrides(job) for job in jobs}
    keys = list(dict.fromkeys(k for o in overrides.values() for k in o))
    swept = [k for k in keys if len({repr(o.get(k, (None, None))[1]) for o in overrides.values()}) > 1]
    fixed = [line for k, (line, _) in overrides[jobs[0]].items() if k not in swept]
    metric, mode = monitor_of(jobs[0])
    trials = []
    for i, job in enumerate(jobs):
        values, steps = logged(job, metric)
        max_steps = setting(job, job_config(job), "trainer.max_steps", (int,), None)
        finished = bool(steps) and max_steps is not None and max(steps) >= max_steps  # steps taken, as logged
        state = "NO METRIC" if not values else "COMPLETE" if finished or max_steps is None else "INCOMPLETE"
        trials.append(
            Trial(
                int(job.name) if job.name.isdigit() else i,
                {k: overrides[job][k][1] for k in swept if k in overrides[job]},
                values[-1] if values else None,
                state,
                best_of(values, mode),
                job,
            )
        )
    return Sweep(path, metric, mode, trials, fixed, header=f"grid multirun, {len(jobs)} jobs")


def read_optuna(path: Path, results: dict[str, Any]) -> Sweep:
    import optuna
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = load_study_read_only(path / RESULTS, results["study_name"], results["storage"])
    mode = "max" if study.direction == optuna.study.StudyDirection.MAXIMIZE else "min"
    jobs = job_dirs(path)
    metric = results.get("metric") or (monitor_of(jobs[0])[0] if jobs else "value")
    trials, log_params, categorical = [], set(), set()
    retries = {
        t.user_attrs[RETRY_OF]: t.number
        for t in study.get_trials(deepcopy=False)
        if isinstance(t.user_attrs.get(RETRY_OF), int)
    }
    for t in study.get_trials(deepcopy=False):
        job = Path(t.user_attrs[JOB_DIR]) if isinstance(t.user_attrs.get(JOB_DIR), str) else None
        values = logged(job, metric)[0] if job is not None and job.is_dir() else []
        trials.append(
            Trial(
                t.number,
                dict(t.params),
                t.value
                if t.value is not None
                else (t.intermediate_values[max(t.intermediate_values)] if t.intermediate_values else None),
                t.state.name,
                best_of(values, mode),
                job,
                f"interrupted, retried as trial {retries[t.number]}"
                if t.number in retries
                else str(t.user_attrs.get(ERROR, ""))[:80],
            )
        )
        log_params |= {
            n for n, d in t.distributions.items() if isinstance(d, (FloatDistribution, IntDistribution)) and d.log
        }
        categorical |= {n for n, d in t.distributions.items() if isinstance(d, CategoricalDistribution)}
    fixed = []
    if jobs:
        common = [job_overrides(j) for j in jobs]
        searched = {n for t in trials for n in t.params}
        fixed = [
            line
            for k, (line, _) in common[0].items()
            if k not in searched and all(c.get(k, (None,))[0] == line for c in common)
        ]
    header = (
        f"Optuna study `{study.study_name}` ({results['storage']}), {study.direction.name.lower()} {metric}, "
        f"{len(trials)} trials: {by_state(trials)}"
    )
    return Sweep(path, metric, mode, trials, fixed, log_params, categorical, header)


def summary(sweep: Sweep) -> list[str]:
    """The lines a sweep ends on: how its trials ended, the best one (its metric and parameters) and
    its run directory, and the command that shows every trial."""
    lines = [f"sweep finished: {len(sweep.trials)} trials ({by_state(sweep.trials)}) in {sweep.path}"]
    best = sweep.best_trial()
    if best is None:
        lines.append(f"no trial completed with {sweep.metric}: see each trial's run directory")
    else:
        params = " ".join(f"{k}={fmt_param(v)}" for k, v in best.params.items())
        lines.append(
            f"best trial: {best.number}, {sweep.metric} = {best.value:.6g} "
            f"({'lowest' if sweep.mode == 'min' else 'highest'}), with {params or 'the fixed settings'}"
        )
        if best.job_dir is not None:
            lines.append(f"its run directory: {best.job_dir}")
    lines.append(f"every trial, and plots: zoo-sweep-report {sweep.path}")
    return lines


def fmt_param(value: Any) -> str:
    """A parameter as an override writes it."""
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def by_state(trials: list[Trial]) -> str:
    """``3 COMPLETE, 1 FAIL``: how many trials ended in each state, in order of first appearance."""
    return ", ".join(f"{sum(t.state == s for t in trials)} {s}" for s in dict.fromkeys(t.state for t in trials))


def load_study_read_only(results: Path, study_name: str, url: str) -> Any:
    """The study an ``optimization_results.yaml`` names, from a storage that must already exist.

    A sqlite file is opened read-only (nothing is created or written, whatever the file says); a
    server URL without creating tables. Anything that cannot be read is a NotASweep naming ``results``."""
    import optuna
    import sqlalchemy

    where = f"{results}: storage {url}"
    if url.startswith("sqlite:"):
        file = Path(url.removeprefix("sqlite:").removeprefix("///").partition("?")[0])
        if not url.startswith("sqlite:///") or not file.is_file():
            raise NotASweep(
                f"{where} is not an existing sqlite file; the report only reads a study, never creates "
                f"one: point storage: at the sweep's database (the sweep printed it)"
            )
        url = f"sqlite:///file:{quote(str(file.resolve()))}?mode=ro&uri=true"  # quote() also escapes { }
    try:
        storage = optuna.storages.RDBStorage(url, skip_table_creation=True)
        return optuna.load_study(study_name=study_name, storage=storage)
    except KeyError:
        raise NotASweep(f"{where} holds no study {study_name!r}; check study_name: in the file") from None
    except (
        sqlalchemy.exc.SQLAlchemyError,
        optuna.exceptions.OptunaError,
        ImportError,
        ValueError,
        RuntimeError,
    ) as error:
        raise NotASweep(
            f"{where} cannot be read as an Optuna study ({first_line(error)}); point storage: at the sweep's database"
        ) from None


def best_of(values: list[float], mode: str) -> float | None:
    finite = [v for v in values if not math.isnan(v)]
    return (min if mode == "min" else max)(finite) if finite else None


def fmt(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value).replace("|", "\\|")


def markdown(sweep: Sweep) -> str:
    better = "lower" if sweep.mode == "min" else "higher"
    lines = [f"# Sweep report: {sweep.path}", "", f"{sweep.header}; {sweep.metric}: {better} is better."]
    best = sweep.best_trial()
    if best is not None:
        lines.append(
            f"Best: trial {best.number}, {sweep.metric} = {best.value:.4g} "
            f"({', '.join(f'{k}={fmt(v)}' for k, v in best.params.items())})."
        )
    if sweep.fixed:
        lines.append("Fixed overrides: " + " ".join(f"`{o}`" for o in sweep.fixed))
    params = sweep.params
    notes = any(t.note for t in sweep.trials)
    head = ["trial", "state", sweep.metric, f"best {sweep.metric}", *params, "run dir", *(["note"] if notes else [])]
    lines += [
        "",
        "| " + " | ".join(head) + " |",
        "|" + "|".join(["---:", "---", "---:", "---:", *["---"] * (len(head) - 4)]) + "|",
    ]
    for t in sweep.trials:
        mark = " ★" if t is best else ""
        job = (
            ""
            if t.job_dir is None
            else (t.job_dir.name if t.job_dir.parent.resolve() == sweep.path.resolve() else str(t.job_dir))
        )
        row = [
            f"{t.number}{mark}",
            t.state,
            fmt(t.value),
            fmt(t.best),
            *(fmt(t.params.get(p)) for p in params),
            job,
            *([fmt(t.note)] if notes else []),
        ]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="zoo-sweep-report", description=__doc__.split("\n\n")[0])
    parser.add_argument("sweep_dir", type=Path, help="a `zoo-train -m` directory (outputs/<task>/multiruns/<date>)")
    parser.add_argument("--no-plots", action="store_true", help="write the table only")
    args = parser.parse_args(argv)
    try:
        sweep = read_sweep(args.sweep_dir)
    except SweepError as error:  # NotASweep, or a damaged file or storage: the message names it
        end(f"{type(error).__name__}: {error}")
    except OSError as error:
        end(
            f"OSError: cannot read {error.filename or args.sweep_dir}: {error.strerror}; check that the folder is "
            f"readable"
        )
    text = markdown(sweep)
    try:
        plots = [] if args.no_plots else plot(sweep, args.sweep_dir)
        if plots:
            text += "\n" + "\n".join(f"![{p.stem}]({p.name})" for p in plots) + "\n"
        (args.sweep_dir / REPORT).write_text(text)
    except OSError as error:
        end(
            f"OSError: cannot write {error.filename or args.sweep_dir}: {error.strerror}; the report writes "
            f"{REPORT} and its plots into the sweep folder: make it writable (or move what is in the way)"
        )
    print(text)
    print(f"written: {args.sweep_dir / REPORT}" + "".join(f", {p.name}" for p in plots))


def end(message: str) -> typing.NoReturn:
    print(f"zoo: {message}", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
    main()
