"""Kept only for tests/test_sweep.py, which another change is editing and still imports ``conf_dir``
from here; what the verbs share lives in tasks/cli/schemas.py, checks.py, loading.py, console.py and
boundary.py. Remove this file once that import names tasks.cli.schemas."""

from tasks.cli.schemas import conf_dir

__all__ = ["conf_dir"]
