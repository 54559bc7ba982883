"""Package discovery: every package under zoo/, tasks/ and hydra_plugins/ is found from the tree, so a
new subpackage ships without an edit. conf/ travels inside the wheel as ``tasks.conf`` (its mapping and
its YAML files are in pyproject.toml); it is added by name because it lives outside tasks/ in the tree.
Everything else about the project is in pyproject.toml."""

from setuptools import find_namespace_packages, setup

# hydra_plugins is a namespace package (Hydra's plug-in convention), hence find_namespace_packages
PACKAGES = find_namespace_packages(include=["zoo", "zoo.*", "tasks", "tasks.*", "hydra_plugins", "hydra_plugins.*"])

setup(packages=[*PACKAGES, "tasks.conf"])
