"""The article study from a checkout: ``python -m scripts.article.run [--quick] [--only N ...] [--out DIR]``
(``python scripts/article/run.py`` works too)
(``--help`` for every option; the study itself is described in driver.py)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/: this folder imports as ``article``

from article.driver import main  # noqa: E402

if __name__ == "__main__":
    main()
