"""zoo-train: train a model on a task, e.g. ``zoo-train experiment=t5_translator model.n_layers=4``.

The entry point is ``tasks.cli.verbs.train`` (a config Hydra cannot compose is refused there, before
Lightning is imported); the run is tasks/cli/training.py. ``python -m tasks.cli.train`` runs it too.
"""

from tasks.cli.verbs import train as main

if __name__ == "__main__":
    main()
