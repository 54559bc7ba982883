"""What a verb takes from the command line as given and keeps off the terminal: free text
(``prompt=``, ``text=``) through the shell and Hydra's grammar unchanged, and library output a user
cannot act on."""

from __future__ import annotations

import logging
import re
import warnings

from omegaconf import DictConfig, OmegaConf


def quote_free_text(argv: list[str], keys: tuple[str, ...] = ("prompt", "text")) -> list[str]:
    """Let ``prompt="def fib(n):"`` through the shell and Hydra's override grammar unchanged: the
    shell strips the quotes, so the value is quoted again here unless it already is."""
    out = []
    for arg in argv:
        key, sep, value = arg.partition("=")
        if sep and key in keys and not (value[:1] in "'\"" and value[-1:] == value[:1] and len(value) > 1):
            value = _quoted(value)
        out.append(f"{key}{sep}{value}" if sep else arg)
    return out


def _quoted(text: str) -> str:
    """``text`` as a Hydra quoted value that OmegaConf keeps as plain text: each ``${`` escaped for
    OmegaConf (n backslashes before it become 2n + 1), then quotes and the backslashes before a
    quote or the end escaped for Hydra (the only places Hydra reads a backslash)."""
    text = re.sub(r"(\\*)\$\{", lambda m: "\\" * (2 * len(m.group(1)) + 1) + "${", text)
    text = re.sub(r"(\\*)('|$)", lambda m: m.group(1) * 2 + ("\\'" if m.group(2) else ""), text)
    return f"'{text}'"


NOISE = (
    "litlogger",  # a tip to install Lightning's cloud logger
    "GPU available:",
    "TPU available:",
    "HPU available:",
    "`Trainer.fit` stopped:",  # the closing table says how the run ended
    "Restoring states from the checkpoint",
    "Loaded model weights from the checkpoint",
    "was configured so",  # `Trainer(limit_val_batches=1)` was configured so 1 batch will be used
    "You are using a CUDA device",  # the tensor-core tip: zoo sets the matmul precision itself
)
"""Lines of Lightning's that a user cannot act on (zoo's own output says what matters of them)."""


def quiet_libraries() -> None:
    """Hide what libraries print that a user cannot act on (:data:`NOISE`), and a deprecation inside
    Lightning's own pytree helper; print each of Lightning's lines once. Lightning's warnings and
    errors pass."""
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\).*")
    logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(
        lambda record: record.levelno > logging.INFO or not any(text in record.getMessage() for text in NOISE)
    )
    lightning_lines_once()
    logging.getLogger("mlflow.store.db.utils").addFilter(  # logger=mlflow: creating its SQLite tables
        lambda record: record.levelno > logging.INFO
    )
    logging.getLogger("lightning.pytorch.loggers.mlflow").addFilter(  # a new experiment: it is made, not lost
        lambda record: "not found. Creating it." not in record.getMessage()
    )


def lightning_lines_once() -> None:
    """Each of Lightning's log lines printed once: importing ``lightning`` gives its logger a handler
    of its own ("INFO: ..." on stderr), and a line also reaches the root logger, where the verb's
    logging (Hydra's ``job_logging: stdout``) prints it again. Where the root logger has a handler,
    Lightning's own is removed: its lines are printed there, plain, with the run's other lines."""
    if logging.getLogger().handlers:
        package = logging.getLogger("lightning")
        for handler in list(package.handlers):
            package.removeHandler(handler)


def literal(cfg: DictConfig, key: str) -> str | None:
    """A free-text value (``prompt=``, ``text=``) exactly as given: no ``${...}`` interpolation
    (the OmegaConf escapes that quote_free_text adds are undone); None when missing."""
    if key not in cfg or OmegaConf.is_missing(cfg, key):
        return None
    value = OmegaConf.to_container(cfg, resolve=False).get(key)
    if value is None:
        return None
    return re.sub(r"(\\*)\$\{", lambda m: "\\" * (len(m.group(1)) // 2) + "${", str(value))
