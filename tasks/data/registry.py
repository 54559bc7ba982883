"""The data modules by class name: the name a checkpoint records (``zoo_run.data_module``)."""

import zoo
from tasks.data.modules import (
    ClassificationDataModule,
    LMDataModule,
    MLMDataModule,
    TextDataModule,
    TranslationDataModule,
)

DATA_MODULES: zoo.Registry[type[TextDataModule]] = zoo.Registry("data module")
"""Data modules by class name: the name a checkpoint records (``zoo_run.data_module``)."""
for _module in (LMDataModule, ClassificationDataModule, MLMDataModule, TranslationDataModule):
    DATA_MODULES.register(_module.__name__)(_module)
