"""The registry's public contract, checked for every registered variant."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

import variants
from tests.reference import Gated, assert_causal, qkv
from variants import registry

CONF = Path(__file__).resolve().parents[2] / "conf" / "attention"
README = Path(__file__).resolve().parents[2] / "README.md"
NAMES = variants.attention_names()

# Model options a kernel may need when built standalone in these tests.
MODEL_OPTIONS = {"n_heads": 3, "head_dim": 8, "max_seq_len": 64}


def build(name, **options):
    spec = variants.attention_spec(name)
    extra = {k: v for k, v in MODEL_OPTIONS.items() if k in spec.model_options}
    return Gated(variants.build_attention(name, **{**extra, **options}))  # gates if it takes any


def test_every_variant_and_preset_is_registered_family_by_family():
    assert set(NAMES) >= {
        "full",
        "blockwise",
        "strided",
        "compressed",
        "combined",
        "longformer",
        "bigbird",
        "sparse_fixed",
        "lsh",
        "routing",
        "linformer",
        "performer",
        "linear",
        "moba",
        "nsa",
        "deltanet",
    }
    families = [variants.attention_spec(n).cls.family for n in NAMES]
    ranks = [variants.registry.FAMILIES.index(f) for f in families]
    assert ranks == sorted(ranks), list(zip(NAMES, families, strict=True))
    presets = {"longformer", "bigbird", "sparse_fixed"}
    assert {n for n in NAMES if variants.attention_spec(n).preset} == presets


def test_block_sparse_work_is_the_classes_flag_and_a_preset_has_its_variants():
    """The variants whose work is a set of (query block, key block) pairs (benchmarks/mask_cost.py
    holds a mask's cost on them to its bound); a preset is its variant's class, so its flag."""
    flagged = {n for n in NAMES if variants.attention_spec(n).block_sparse_work}
    assert flagged == {
        "full",
        "blockwise",
        "strided",
        "compressed",
        "combined",
        "longformer",
        "bigbird",
        "sparse_fixed",
        "moba",
        "nsa",
        "sliding_window",
    }
    for name in NAMES:
        spec = variants.attention_spec(name)
        assert spec.block_sparse_work == spec.cls.block_sparse_work


def composed(stem: str) -> dict:
    """conf/attention/<stem>.yaml as Hydra composes it (a preset's YAML extends its variant's)."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF.parent), version_base="1.3"):
        return OmegaConf.to_container(compose(overrides=[f"+attention={stem}"]))["attention"]


def as_yaml(options: dict) -> dict:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in options.items()}


@pytest.mark.parametrize("name", [n for n in NAMES if (CONF / f"{n}.yaml").is_file()])
def test_conf_yaml_equals_code_defaults(name):
    options = variants.attention_spec(name).options  # a YAML list is the code's tuple
    assert composed(name) == {"name": name, **as_yaml(options)}


@pytest.mark.parametrize("name", [n for n in NAMES if variants.attention_spec(n).preset])
def test_a_preset_yaml_holds_only_its_own_defaults_on_its_variants(name):
    # Each default in one place: the variant's in its YAML, the preset's own beside them.
    spec = variants.attention_spec(name)
    conf = yaml.safe_load((CONF / f"{name}.yaml").read_text())
    assert conf.pop("defaults") == [spec.variant, "_self_"]
    assert conf == {"name": name, **as_yaml(spec.preset)}


def test_a_preset_builds_its_variant_with_its_defaults_and_overrides():
    kernel = variants.build_attention("bigbird", causal=True, n_random=1)
    assert type(kernel) is variants.attention_spec("combined").cls
    assert kernel.parts == ("local", "global", "random") and kernel.block_size == 64
    assert kernel.n_random == 1 and kernel.causal


def test_every_conf_yaml_is_a_registered_variant():
    """A YAML named after a variant (optional) holds its defaults; any other
    (`moba_small.yaml`) is a setting of the variant it names, whose options it must all take."""
    named = {p.stem: yaml.safe_load(p.read_text()) for p in CONF.glob("*.yaml")}
    # A variant's YAML is optional (a plugin's options come from its constructor).
    assert {stem for stem, conf in named.items() if conf["name"] == stem} <= set(NAMES)
    for stem, conf in named.items():
        assert conf["name"] in NAMES, stem
        own = set(conf) - {"name", "defaults"}
        assert own <= set(variants.attention_spec(conf["name"]).options), stem


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("length", [1, 7, 50])
def test_output_shape_equals_input_shape(name, length):
    q, k, v = qkv(2, 3, length, 8, dtype=torch.float32)
    out = build(name)(q, k, v)
    assert out.shape == q.shape and torch.isfinite(out).all()


@pytest.mark.parametrize("name", [n for n in NAMES if variants.attention_spec(n).causal_supported])
def test_causal_variants_do_not_look_ahead(name):
    # float64 inputs, so the module's parameters (compressed's conv) must be float64 too.
    # assert_causal's inputs have 2 heads (routing's centroids are per head).
    heads = {"n_heads": 2} if "n_heads" in variants.attention_spec(name).model_options else {}
    module = build(name, causal=True, **heads).double().eval()
    # Random choices (LSH's hash) are replayed, so only the inputs after t differ. Without the
    # replay LSH's global sort lets later tokens' buckets move earlier chunk boundaries, which
    # lsh/layer.py documents; no key or value after t is ever read either way.
    assert_causal(module, length=48, t=20, replay=True)


def test_built_takes_the_model_options_a_variant_declares_from_all_of_them():
    model = {"causal": False, "n_heads": 3, "head_dim": 8, "max_seq_len": 64, "shared_qk": True}
    linear = variants.attention_spec("linear").built({}, model)  # declares causal alone
    assert linear.causal is False
    linformer = variants.attention_spec("linformer").built({"k": 4}, model)
    assert linformer.max_seq_len == 64 and linformer.n_heads == 3
    routing = variants.attention_spec("routing").built({}, {"causal": True})  # the rest: defaults
    assert routing.causal is True


def test_unknown_variant_lists_the_available_ones():
    with pytest.raises(ValueError, match="unknown attention variant 'flash'; available: full"):
        variants.build_attention("flash")


def test_unknown_option_names_variant_and_option():
    with pytest.raises(ValueError, match="attention 'full' has no option 'n_hashes'"):
        variants.build_attention("full", n_hashes=4)


def test_unsupported_causal_names_variant_and_option():
    with pytest.raises(
        variants.UnsupportedCombination,
        match="attention 'linformer' does not support option causal=True",
    ):
        variants.build_attention("linformer", causal=True)


def test_unsupported_combinations_are_told_apart_from_invalid_options():
    """The runner records the first `skipped` and the second `error`, without reading text."""
    assert issubclass(variants.UnsupportedCombination, ValueError)
    with pytest.raises(variants.UnsupportedCombination, match="'lsh'.*'shared_qk'"):
        variants.TransformerLM(
            vocab_size=8, d_model=16, n_heads=2, attention="lsh", shared_qk=False
        )
    with pytest.raises(ValueError) as invalid:
        variants.build_attention("lsh", n_hashes=0)
    assert not isinstance(invalid.value, variants.UnsupportedCombination)


def test_bad_choice_names_option_and_choices():
    with pytest.raises(ValueError, match="full: option 'impl' must be one of sdpa, sdpa_math, "):
        variants.build_attention("full", impl="flash")


@pytest.mark.parametrize(
    "shapes, message",
    [
        (((2, 3, 8, 4), (2, 3, 8, 4), (2, 3, 9, 4)), "q, k and v must have the same shape"),
        (((3, 8, 4),) * 3, r"input q must have shape \(batch, heads, seq_len, head_dim\)"),
    ],
)
def test_mismatched_shapes_name_the_constraint(shapes, message):
    q, k, v = (torch.randn(s) for s in shapes)
    with pytest.raises(ValueError, match=message):
        variants.build_attention("full")(q, k, v)


def test_readme_registry_table_is_generated_from_the_specs():
    assert variants.registry_table() in README.read_text()


def test_the_table_command_says_what_it_prints():
    done = subprocess.run(
        [sys.executable, "-m", "variants", "--help"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and "usage: python -m variants" in done.stdout
    assert "README.md" in done.stdout and "registry table" in done.stdout


def test_published_as_comes_from_the_class_or_the_preset_and_reaches_the_suite_tables():
    from analysis import suites

    assert registry.attention_spec("longformer").published_as == {"lra": "Longformer"}
    assert registry.attention_spec("combined").published_as == {}  # the preset's, not its base's
    assert registry.attention_spec("lsh").published_as == {"lra": "Reformer"}
    assert suites.published_as("lsh", "lra") == "Reformer"
    assert suites.published_as("lsh", "mad") is None
    assert suites.published_as("not_registered", "lra") is None
