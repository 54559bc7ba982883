"""``python -m tasks.cli.export``: zoo-export without its script on PATH (``tasks.cli.verbs.export``, where
Hydra composes the config; the verb's own modules never import ``verbs.py``)."""

from tasks.cli.verbs import export

if __name__ == "__main__":
    export()
