"""Lightning tasks and data modules on top of the zoo library."""

from tasks.base import ZooTask
from tasks.classifier import ClassifierTask
from tasks.generator import GeneratorTask
from tasks.mlm import MLMTask
from tasks.translator import TranslatorTask

TASKS = {"generator": GeneratorTask, "classifier": ClassifierTask, "mlm": MLMTask, "translator": TranslatorTask}

__all__ = ["TASKS", "ClassifierTask", "GeneratorTask", "MLMTask", "TranslatorTask", "ZooTask"]
