"""How the sweeper and zoo-sweep-report fail on what they are given: one SweepError line naming the
setting or file and the fix, for a bad option, a damaged YAML file, or a storage that is no Optuna
database. Light (no Optuna import): the report's plugin-scanned module imports it."""

from __future__ import annotations

from pathlib import Path
from typing import Any


class SweepError(ValueError):
    """A sweep that cannot start, go on or be read. The message names the setting or file and the fix;
    the sweeper and zoo-sweep-report print it as one ``zoo: SweepError: ...`` line."""


def read_yaml(path: Path, fix: str) -> Any:
    """``path`` as plain YAML data: no OmegaConf interpolation is resolved (``${oc.env:...}`` stays text).
    A file that cannot be read or parsed is a SweepError naming it, ending with ``fix``."""
    import yaml

    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
        mark = getattr(error, "problem_mark", None)
        where = f"line {mark.line + 1}: {error.problem}" if mark is not None else first_line(error)
        raise SweepError(f"{path} cannot be read as YAML ({where}); {fix}") from None


def first_line(error: BaseException, limit: int = 160) -> str:
    """An error's first line, shortened: for a one-line message. A wrapped error (SQLAlchemy around
    sqlite3, Optuna around SQLAlchemy) gives its cause's message."""
    cause = error.__cause__ or error
    if isinstance(cause, OSError) and cause.strerror:
        return cause.strerror
    text = " ".join(str(cause).split("\n", 1)[0].split())
    return text[:limit] or type(cause).__name__


def storage_error(url: str, error: BaseException) -> SweepError:
    """A storage that cannot be opened or used, as one line with the fix for its kind."""
    if url.startswith("sqlite:"):
        fix = (
            "move that file away or repair it, or give hydra.sweeper.storage=sqlite:///<a new file> "
            "(a new file starts a new study)"
        )
    else:
        fix = "check that the database server runs and the URL is right, or give hydra.sweeper.storage= another one"
    missing = error.__cause__ if isinstance(error.__cause__, ImportError) else error  # optuna wraps the driver's
    if isinstance(missing, ImportError):
        fix = f"install the database driver it needs ({missing.name or first_line(missing)})"
    return SweepError(f"the sweep's storage {url} cannot be used as an Optuna database ({first_line(error)}); {fix}")


# What zoo-sweep-report reads of each job of a sweep: each damaged file is a SweepError naming it.


def moved_out(job: Path) -> str:
    return f"repair it, or move {job} out of {job.parent} to report the other jobs"


def job_overrides(job: Path) -> dict[str, tuple[str, Any]]:
    """The command-line overrides a job ran with (``.hydra/overrides.yaml``): key -> (override line, value)."""
    path = job / ".hydra" / "overrides.yaml"
    lines = read_yaml(path, moved_out(job))
    if not isinstance(lines, list) or not all(isinstance(line, str) for line in lines):
        raise SweepError(f"{path} is not the list of override lines Hydra writes; {moved_out(job)}")
    return parse_overrides(lines, path)


def parse_overrides(lines: list[str], path: Path) -> dict[str, tuple[str, Any]]:
    """override key -> (the override as written, its typed value)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser, out = OverridesParser.create(), {}
    for line in lines:
        try:
            override = parser.parse_override(line)
        except HydraException as error:
            job = path.parents[1]
            raise SweepError(f"{path}: {line!r} is not an override ({first_line(error)}); {moved_out(job)}") from None
        value = override.value() if not override.is_sweep_override() else override.get_value_string()
        out[override.get_key_element()] = (line, value)
    return out


def job_config(job: Path) -> dict[str, Any]:
    """A job's composed config as plain data (``config.yaml``, else ``.hydra/config.yaml``; {} without one)."""
    for path in (job / "config.yaml", job / ".hydra" / "config.yaml"):
        if path.is_file():
            cfg = read_yaml(path, moved_out(job))
            if not isinstance(cfg, dict):
                raise SweepError(f"{path} holds a {type(cfg).__name__}, not a config; {moved_out(job)}")
            return cfg
    return {}


def setting(job: Path, cfg: dict[str, Any], key: str, kinds: tuple[type, ...], default: Any) -> Any:
    """``cfg``'s dotted ``key`` (``default`` where it is missing or null), which must be of ``kinds``."""
    value: Any = cfg
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    if value is None:
        return default
    if not isinstance(value, kinds) or isinstance(value, bool):
        raise SweepError(
            f"{job / 'config.yaml'}: {key}={value!r} should be of type {kinds[0].__name__}; {moved_out(job)}"
        )
    return value


def monitor_of(job: Path) -> tuple[str, str]:
    """The metric a job's run followed and whether lower (min) or higher (max) is better."""
    cfg = job_config(job)
    metric = setting(job, cfg, "monitor.metric", (str,), "val/loss")
    mode = setting(job, cfg, "monitor.mode", (str,), "min")
    if mode not in ("min", "max"):
        raise SweepError(f"{job / 'config.yaml'}: monitor.mode={mode!r} is neither min nor max; {moved_out(job)}")
    return metric, mode


def logged(job: Path, metric: str) -> tuple[list[float], list[int]]:
    """The metric's values over a run, and the steps logged (the optimizer steps taken, as the
    checkpoint names count them), from its CSV logs."""
    import csv

    values, steps = [], []
    for path in sorted(job.glob("logs/**/metrics.csv")):
        try:
            with path.open(encoding="utf-8", newline="") as f:
                for row in csv.DictReader(f):
                    step, value = row.get("step"), row.get(metric)
                    if step:
                        steps.append(int(float(step)))
                    if value:
                        values.append(float(value))
        except (OSError, UnicodeDecodeError, csv.Error, ValueError, TypeError) as error:
            raise SweepError(
                f"{path} cannot be read as a metrics table ({first_line(error)}); {moved_out(job)}"
            ) from None
    return values, steps
