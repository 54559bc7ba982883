"""The tasks by the name a checkpoint records (``zoo_run.task``) and conf/task/ files are named after."""

import zoo
from tasks.base import ZooTask
from tasks.classifier import ClassifierTask
from tasks.generator import GeneratorTask
from tasks.mlm import MLMTask
from tasks.translator import TranslatorTask

TASKS: zoo.Registry[type[ZooTask]] = zoo.Registry("task")
"""Tasks by the name a checkpoint records (``zoo_run.task``) and conf/task/ files are named after."""
for _name, _task in (
    ("generator", GeneratorTask),
    ("classifier", ClassifierTask),
    ("mlm", MLMTask),
    ("translator", TranslatorTask),
):
    TASKS.register(_name)(_task)
