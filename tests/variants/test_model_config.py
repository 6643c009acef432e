"""ModelConfig: one checked object, the variant looked up once, shared by every module."""

import pytest
import torch

import variants
import variants.model_config
from variants import ModelConfig, TransformerLM


def test_a_model_built_from_its_config_is_the_model_built_from_the_fields():
    fields = {"vocab_size": 11, "d_model": 16, "n_heads": 2, "depth": 2, "attention": "lsh"}
    torch.manual_seed(0)
    from_fields = TransformerLM(**fields)
    torch.manual_seed(0)
    from_config = TransformerLM(ModelConfig(**fields))
    assert from_fields.config == from_config.config
    for (name, a), (_, b) in zip(
        from_fields.state_dict().items(), from_config.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name


def test_every_layer_holds_the_models_one_config(monkeypatch):
    looked_up = []
    real = variants.model_config.attention_spec
    monkeypatch.setattr(
        variants.model_config, "attention_spec", lambda name: looked_up.append(name) or real(name)
    )
    model = TransformerLM(vocab_size=11, d_model=16, n_heads=2, depth=3, block="reversible")
    assert looked_up == ["full"]  # once per model, not once per layer
    layers = [m for m in model.modules() if isinstance(m, variants.layers.SelfAttention)]
    assert len(layers) == 3 and all(layer.config is model.config for layer in layers)


def test_the_model_builds_each_layers_kernel_and_hands_it_to_the_layer(monkeypatch):
    built = []
    real = ModelConfig.kernel
    monkeypatch.setattr(
        ModelConfig, "kernel", lambda self, *a: built.append(real(self, *a)) or built[-1]
    )
    model = TransformerLM(vocab_size=11, d_model=16, n_heads=2, depth=3, attention="linear")
    assert list(model.kernels()) == built  # one per layer, the very kernels the config built


def test_shared_qk_resolves_to_what_the_variant_requires():
    assert ModelConfig(attention="lsh").shared_qk is True
    assert ModelConfig(attention="full").shared_qk is False
    assert ModelConfig(attention="full", shared_qk=True).shared_qk is True
    assert variants.resolve_shared_qk("routing", None) is True
    assert variants.resolve_shared_qk("lsh", False) is False  # refused when the kernels are built


@pytest.mark.parametrize(
    "fields, words",
    [
        (
            {"d_model": 10, "n_heads": 3},
            ["TransformerLM", "'d_model'=10", "divisible", "'n_heads'"],
        ),
        ({"max_seq_len": 0}, ["'max_seq_len'", "positive"]),
        ({"causal": 1}, ["'causal'", "true or false"]),
        ({"attention_options": {"n_heads": 2}}, ["model option 'n_heads'"]),
        ({"attention_options": [1]}, ["'attention_options'", "mapping"]),
        ({"attention": "nope"}, ["unknown attention variant 'nope'"]),
        ({"readout": "mean"}, ["'readout'", "tokens", "pooled"]),
        (
            {"readout": "pooled", "family": "hf_llama", "positions": "rotary"},
            ["'readout'", "hf_llama"],
        ),
    ],
)
def test_bad_fields_are_refused_naming_the_option(fields, words):
    with pytest.raises(ValueError) as caught:
        ModelConfig(**fields)
    assert not [w for w in words if w not in str(caught.value)], str(caught.value)


def test_a_config_and_its_fields_together_are_refused():
    with pytest.raises(TypeError, match="not both"):
        TransformerLM(ModelConfig(), depth=3)
    with pytest.raises(TypeError, match="not both"):
        variants.build_block("residual", ModelConfig(), depth=3)


def test_replaced_kernels_are_tied_as_the_models_and_restored():
    model = TransformerLM(vocab_size=11, d_model=16, n_heads=2, depth=2, causal=False)
    own = list(model.kernels())
    layerwise = {"share": "layerwise", "k": 4}
    with model.kernels_replaced("linformer", layerwise):
        first, second = model.kernels()
        assert first.name == "linformer" and first is not second
        shared = set(map(id, first.parameters()))
        assert shared and shared == set(map(id, second.parameters()))  # one projection
    assert list(model.kernels()) == own


def test_a_refused_replacement_replaces_nothing():
    model = TransformerLM(vocab_size=11, d_model=16, n_heads=2, depth=2)
    own = list(model.kernels())
    with pytest.raises(ValueError, match="'lsh'.*'shared_qk'"):
        with model.kernels_replaced("lsh"):
            pass
    with pytest.raises(ValueError, match="'nsa' takes 3 gates per token.*built with 0"):
        with model.kernels_replaced("nsa"):  # the layers project no gates for it
            pass
    assert list(model.kernels()) == own
