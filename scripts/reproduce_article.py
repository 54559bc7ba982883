"""Run the article's six experiments (same as ``zoo-reproduce``): ``python scripts/reproduce_article.py --quick``."""

from tasks.cli.reproduce import main

if __name__ == "__main__":
    main()
