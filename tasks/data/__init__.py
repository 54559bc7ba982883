from tasks.data.modules import (
    ClassificationDataModule,
    LMDataModule,
    MLMDataModule,
    TextDataModule,
    TranslationDataModule,
)

DATA_MODULES = {cls.__name__: cls for cls in (LMDataModule, ClassificationDataModule, MLMDataModule,
                                               TranslationDataModule)}

__all__ = ["DATA_MODULES", "ClassificationDataModule", "LMDataModule", "MLMDataModule", "TextDataModule",
           "TranslationDataModule"]
