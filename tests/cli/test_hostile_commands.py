"""Hostile command lines: each mistake is one error line naming the option, never a traceback or a later raw error."""

from __future__ import annotations

import pytest

from twinkle.config import ConfigError


def test_serve_with_an_unknown_model_type_is_one_line(capsys, monkeypatch, tmp_path) -> None:
    import twinkle_server.server as server
    from twinkle_server.cli import main

    monkeypatch.setattr(server, "serve", lambda config: pytest.fail("the config was accepted"))
    keys = tmp_path / "keys.txt"
    keys.write_text("")
    assert main(["--model.type", "NoSuchModel", "--server.api-keys-file", str(keys)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("twinkle serve: error: --model.type: ") and "NoSuchModel" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_train_with_a_seed_past_numpy_range_is_one_line(capsys) -> None:
    from twinkle.cli import train_cmd

    assert train_cmd.run(["--total-step", "1", "--seed", str(2**64)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("twinkle train: error: --seed: invalid value '18446744073709551616'; expected int <= ")


def test_train_with_an_empty_work_dir_is_refused(capsys) -> None:
    from twinkle.cli import train_cmd

    assert train_cmd.run(["--total-step", "1", "--work-dir", ""]) == 2
    assert "--work-dir: invalid value ''; expected path" in capsys.readouterr().err


def test_unknown_model_kwargs_name_the_option() -> None:
    from twinkle.launch import InfraConfig, ModelConfig, build_model

    with pytest.raises(ConfigError, match=r"model.kwargs: 'no_such_arg' is not an argument of TransformersModel or "
                                          r"of the model it builds .*remove it from model.kwargs") as info:
        build_model(ModelConfig(kwargs={"no_such_arg": 1}), InfraConfig())
    assert info.value.option == "model.kwargs"
