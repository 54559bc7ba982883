"""``python -m tasks.cli.evaluate``: zoo-eval without its script on PATH (``tasks.cli.verbs.evaluate``, where
Hydra composes the config; the verb's own modules never import ``verbs.py``)."""

from tasks.cli.verbs import evaluate

if __name__ == "__main__":
    evaluate()
