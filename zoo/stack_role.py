"""Where a stack sits in its form. The form (zoo.models) knows it and hands it down when it builds a stack,
so that a component whose behaviour depends on it (a sliding window's causality, DeepNorm's constants)
is told, and never looks the model's form up itself."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StackRole:
    """``causal``: the form's own mask for this stack is causal (a decoder's); ``cross``: its blocks attend
    over an encoder's output too; ``paired``: it is one of an encoder-decoder's two stacks. The default is
    a lone bidirectional stack (an encoder's)."""

    causal: bool = False
    cross: bool = False
    paired: bool = False


LONE = StackRole()
"""A lone bidirectional stack: what a component built outside a form (in a test, a notebook) is given."""
