"""GradianConfig: defaults, YAML, --set overrides, and errors that name the key and the allowed values."""

from __future__ import annotations

import pytest

from gradian.config import GradianConfig, build_config, known_keys, load_config
from gradian.errors import ConfigError

SPEC_KEYS = [
    "grads.batch_size", "grads.max_seq_length", "grads.module_filter", "grads.storage_dtype",
    "grads.projection_dim", "evaluation.metric", "evaluation.query_signal", "evaluation.require_significant",
]


def test_every_key_the_spec_names_exists():
    assert set(SPEC_KEYS) <= set(known_keys())
    assert {"grads", "evaluation", "attribution", "train"} <= {k.split(".")[0] for k in known_keys()}


def test_defaults_are_safe():
    cfg = GradianConfig()
    assert cfg.grads.projection_dim == "auto"  # exact when small, a size-following sketch otherwise
    assert cfg.grads.storage_dtype == "float16"  # half of float32 at no measured cost
    assert cfg.evaluation.require_significant is True
    assert cfg.evaluation.bootstrap_samples == 10000


def test_projection_dim_takes_auto_an_integer_or_null():
    assert load_config(None, ["grads.projection_dim=auto"]).grads.projection_dim == "auto"
    assert load_config(None, ["grads.projection_dim=null"]).grads.projection_dim is None
    assert load_config(None, ["grads.projection_dim=4096"]).grads.projection_dim == 4096
    with pytest.raises(ConfigError) as caught:
        load_config(None, ["grads.projection_dim=wide"])
    assert "an integer >= 1, auto or null" in caught.value.one_line()


def test_yaml_then_set_overrides(tmp_path):
    path = tmp_path / "gradian.yaml"
    path.write_text("grads:\n  batch_size: 2\n  module_filter: down_proj\n  storage_dtype: bfloat16\n"
                    "train:\n  target_modules: [q_proj, v_proj]\n")
    cfg = load_config(path, ["grads.batch_size=4", "grads.projection_dim=2048", "evaluation.metric=contains",
                             "attribution.damping=null", "train.learning_rate=1e-4"])
    assert cfg.grads.batch_size == 4 and cfg.grads.module_filter == "down_proj"
    assert cfg.grads.storage_dtype == "bfloat16" and cfg.grads.projection_dim == 2048
    assert cfg.evaluation.metric == "contains" and cfg.attribution.damping is None
    assert cfg.train.target_modules == ("q_proj", "v_proj") and cfg.train.learning_rate == 1e-4


def test_set_accepts_a_comma_list_and_back_to_null():
    cfg = load_config(None, ["train.target_modules=q_proj,down_proj", "grads.projection_dim=8", "grads.projection_dim=null"])
    assert cfg.train.target_modules == ("q_proj", "down_proj") and cfg.grads.projection_dim is None


def test_to_dict_round_trips():
    cfg = load_config(None, ["grads.module_filter=layers\\.1\\.", "train.lora_r=4"])
    assert build_config(cfg.to_dict()) == cfg
    assert cfg.section_hash("grads") != GradianConfig().section_hash("grads")


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("grads.bach_size=4", "did you mean grads.batch_size"),
        ("nosection.key=1", "unknown config key nosection.key"),
        ("attribution.chunk_size=1024", "use attribution.chunk_mb (a memory budget in MiB"),
        ("attribution.chunk_mb=0", "attribution.chunk_mb must be a number > 0.0"),
        ("grads.batch_size=0", "grads.batch_size must be an integer >= 1"),
        ("grads.batch_size=two", "grads.batch_size must be an integer >= 1"),
        ("grads.batch_size=2.5", "grads.batch_size must be an integer"),
        ("grads.storage_dtype=int8", "one of float32, float16, bfloat16"),
        ("evaluation.metric=bleu", "one of exact_match, contains, token_f1, loglik"),
        ("evaluation.query_signal=magic", "one of classic, contrastive, divergence, divergent-token, margin, auto"),
        ("evaluation.require_significant=maybe", "true or false"),
        ("grads.projection_dim=0", "grads.projection_dim must be an integer >= 1, auto or null"),
        ("evaluation.confidence=1.5", "in [0.5, 0.999]"),
        ("train.learning_rate=0", "train.learning_rate must be a number in [0.0, 1.0]"),
        ("attribution.cluster_prior=-1", "attribution.cluster_prior must be a number >= 0.0"),
        ("attribution.cluster_prior=nan", "attribution.cluster_prior must be a number >= 0.0"),
        ("attribution.cluster_prior=inf", "attribution.cluster_prior must be a number >= 0.0"),
        ("attribution.damping_ratio=nan", "attribution.damping_ratio must be a number >= 0.0"),
        ("batch_size=4", "is not section.key=value"),
        ("grads.batch_size", "is not section.key=value"),
    ],
)
def test_bad_overrides_name_the_key_and_the_allowed_values(override, needle):
    with pytest.raises(ConfigError) as caught:
        load_config(None, [override])
    assert needle in caught.value.one_line()


def test_bad_config_files(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("grads:\n  batch_size: [1,\n")
    with pytest.raises(ConfigError) as caught:
        load_config(broken)
    assert f"{broken}:" in caught.value.message
    listy = tmp_path / "list.yaml"
    listy.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="not a mapping"):
        load_config(listy)
    flat = tmp_path / "flat.yaml"
    flat.write_text("grads: 3\n")
    with pytest.raises(ConfigError, match="section grads is not a mapping"):
        load_config(flat)
