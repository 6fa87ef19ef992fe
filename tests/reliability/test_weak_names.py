"""Weak names: names with a trailing newline, and a misspelled top-level config key."""

from __future__ import annotations

import pytest
from hf_testing import make_model
from peft import LoraConfig

from twinkle.cli import CLI
from twinkle.config import ConfigError


@pytest.mark.parametrize("name", ["tenant\n", "a\nb", "ok ", "x/y", ""])
def test_tenant_and_adapter_names_must_match_entirely(name) -> None:
    from hf_testing import tiny_config

    from twinkle.model import MultiLoraTransformersModel

    model = MultiLoraTransformersModel(config=tiny_config(), mixed_precision="no", max_loras=1, max_r=4,
                                       target_modules=["q_proj"])
    with pytest.raises(ValueError, match="tenant=.* identifier-like"):
        model.multi_lora.acquire_lora(name, LoraConfig(r=4, target_modules=["q_proj"]))
    assert model.multi_lora.names() == []
    plain = make_model()
    with pytest.raises(ValueError, match="adapter_name=.* identifier-like"):
        plain.add_adapter_to_model(name, LoraConfig(r=4, target_modules=["q_proj"]))
    assert not plain.is_peft


@pytest.mark.parametrize("text,key,close", [
    ("traning:\n  batch_size: 4\n", "traning", "training"),
    ("learnig_rate: 0.001\n", "learnig_rate", "learning-rate"),
])
def test_a_misspelled_top_level_key_is_refused_naming_the_closest(tmp_path, text, key, close) -> None:
    """An undeclared key is an error (it used to be a warning and the value went to the script unseen)."""
    config = tmp_path / "job.yaml"
    config.write_text(text)
    with pytest.raises(ConfigError, match=rf"{key}: unknown option; did you mean --{close}\?"):
        CLI.parse(["--config", str(config)], environ={})


def test_script_keys_declared_as_extras_stay_quiet_and_undeclared_ones_say_how(tmp_path, recwarn) -> None:
    config = tmp_path / "job.yaml"
    config.write_text("extra:\n  reward_scale: 2.0\n  traning: 1\n")
    args = CLI.parse(["--config", str(config), "--extra.my-flag"], environ={})
    assert args.extra == {"reward_scale": 2.0, "traning": 1, "my_flag": True}
    assert not [w for w in recwarn if "twinkle option" in str(w.message)]
    config.write_text("reward_scale: 2.0\n")
    with pytest.raises(ConfigError, match=r"reward_scale: unknown option; A script's own option is declared"):
        CLI.parse(["--config", str(config)], environ={})
