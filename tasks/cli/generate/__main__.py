"""``python -m tasks.cli.generate``: zoo-generate without its script on PATH (``tasks.cli.verbs.generate``, where
Hydra composes the config; the verb's own modules never import ``verbs.py``)."""

from tasks.cli.verbs import generate

if __name__ == "__main__":
    generate()
