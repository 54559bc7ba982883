"""A runtime that is installed but imports a module that is not (tests/checker_stand_ins.py,
``MissingDependency``), as a llama-cpp-python installed without its dependencies."""

import zoo_checker_absent_dependency  # noqa: F401
