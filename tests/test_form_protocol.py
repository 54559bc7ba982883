"""The protocols of zoo/form.py are what the layers below the models read: every registered form
has each member ``Form`` names, and each form that generates has what its decoding loop's protocol
names (zoo.decoding types against these, not against the model classes)."""

from __future__ import annotations

import inspect

import pytest

import zoo
from zoo.form import ContinuesPrompts, Form, Generates, TranslatesSources
from zoo.registry import ARCH

LOOPS = {"decoder": ContinuesPrompts, "encoder_decoder": TranslatesSources}


def members(protocol: type) -> set[str]:
    """What ``protocol`` declares (its own and its bases'), annotations and methods alike."""
    found: set[str] = set()
    for cls in protocol.__mro__:
        if cls in (object,) or cls.__name__ in ("Protocol", "Generic"):
            continue
        found |= set(vars(cls).get("__annotations__", {}))
        found |= {
            n for n, v in vars(cls).items() if not n.startswith("_") and (callable(v) or inspect.isdatadescriptor(v))
        }
        found |= {n for n, v in vars(cls).items() if isinstance(v, classmethod | property)}
    return found


@pytest.mark.parametrize("preset", ["bert-tiny", "gpt-tiny", "t5-tiny"])
def test_each_form_has_what_its_protocols_name(preset):
    model = zoo.create_model(preset)
    form = type(model)
    assert form is ARCH.get(model.config.arch)
    missing = [name for name in members(Form) if not hasattr(form, name)]
    assert not missing, missing
    loop = LOOPS.get(form.decoding)
    assert (loop is None) == (form.decoding is None)
    if loop is not None:
        wanted = members(loop) | members(Generates)
        missing = [name for name in wanted if not hasattr(model, name)]
        assert not missing, missing


def test_the_member_walk_sees_what_a_protocol_declares():
    assert {"config", "max_positions", "logits", "new_cache"} <= members(Generates)
    assert {"needs_prefix_len", "features", "logits"} <= members(ContinuesPrompts)
    assert {"natural_mask", "decoding", "check", "cached_layers"} <= members(Form)
