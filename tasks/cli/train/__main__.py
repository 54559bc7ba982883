"""``python -m tasks.cli.train``: zoo-train without its script on PATH (``tasks.cli.verbs.train``, where
Hydra composes the config; the verb's own modules never import ``verbs.py``)."""

from tasks.cli.verbs import train

if __name__ == "__main__":
    train()
