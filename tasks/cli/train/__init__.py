"""The train wing: what zoo-train runs once Hydra has composed its config (``tasks.cli.verbs.train``).

``training.py`` (``run``): plan, build, fit, test, summarise; ``plan.py``: what a run starts from, read
once; ``checks.py``: the composition checks a run passes before Lightning builds anything.
``python -m tasks.cli.train`` runs zoo-train too (``__main__.py``)."""
