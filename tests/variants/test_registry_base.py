"""The one registry helper behind attention variants, block types and tasks."""

import sys

import pytest

import variants
from experiments.training import tasks
from variants.registry_base import Registry


def test_entries_keep_their_order_and_a_name_is_registered_once():
    things = Registry("thing")
    things.add("b", 1)
    things.add("a", 2)
    assert things.names() == ["b", "a"] and things["a"] == 2 and list(things) == ["b", "a"]
    with pytest.raises(ValueError, match="thing 'a' is registered twice"):
        things.add("a", 3)
    with pytest.raises(ValueError, match="unknown thing 'c'; available: b, a"):
        things["c"]


def test_builtins_are_imported_on_the_first_lookup(monkeypatch):
    monkeypatch.delitem(sys.modules, "json.tool", raising=False)
    things = Registry("thing", builtins=["json.tool"])
    assert "json.tool" not in sys.modules
    assert things.names() == []
    assert "json.tool" in sys.modules


def test_variants_blocks_and_tasks_answer_alike():
    for lookup, kind in (
        (variants.attention_spec, "attention variant"),
        (lambda name: variants.build_block(name, 8, 2), "block"),
        (lambda name: tasks.build_task({"name": name}, seq_len=8, batch_size=1, seed=0), "task"),
    ):
        with pytest.raises(ValueError, match=f"unknown {kind} 'nope'; available: "):
            lookup("nope")
