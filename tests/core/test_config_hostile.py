"""Hostile config files and values: alias bombs refused before they are expanded, every error message of a
readable length, repeated keys, optimizer.kwargs repeating a field, empty paths and seeds past numpy's range."""

from __future__ import annotations

import pytest

from twinkle.config import ConfigError, load_file
from twinkle.config.files import MAX_VALUES
from twinkle.config.schema import MAX_MESSAGE
from twinkle.trainer import TrainerConfig

#: the longest message cut() leaves: the kept head and tail, the count of what was cut and the separators
LONGEST = MAX_MESSAGE + 60


def _bomb(levels: int, under: str) -> str:
    """``levels`` anchors, each a list of nine aliases of the one before: 9**levels strings in a few hundred bytes."""
    lines = ['l0: &l0 ["x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, levels)]
    head, _, field = under.rpartition(".")
    value = f"*l{levels - 1}"
    lines.append(f"{head}: {{{field}: {value}}}" if head else f"{field}: {value}")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("under", ["lora.target_modules", "prober_list"])
def test_alias_bomb_is_refused_naming_the_file(tmp_path, under) -> None:
    # six levels: 9**6 = 531441 values, past MAX_VALUES, but small enough that an unbounded loader finishes
    # (with a message of megabytes) instead of hanging the test
    assert 9**6 > MAX_VALUES
    path = tmp_path / "bomb.yaml"
    path.write_text(_bomb(6, under))
    assert path.stat().st_size < 600
    with pytest.raises(ConfigError) as info:
        TrainerConfig.from_file(path)
    message = str(info.value)
    assert len(message) <= LONGEST
    assert str(path) in message and f"more than {MAX_VALUES} values" in message


def test_nine_level_bomb_is_refused_too(tmp_path) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(_bomb(9, "lora.target_modules"))  # 9**9 = 387 million values in under 600 bytes
    with pytest.raises(ConfigError, match=rf"{path.name}: it means more than {MAX_VALUES} values"):
        load_file(path)


def test_merge_key_bomb_is_refused_before_it_is_constructed(tmp_path) -> None:
    # '<<:' copies the aliased mapping's entries when the document is constructed: counted on the nodes, before
    lines = ["l0: &l0 {" + ", ".join(f"k{i}: 1" for i in range(9)) + "}"]
    lines += [f"l{i}: &l{i} {{<<: [{', '.join([f'*l{i - 1}'] * 9)}]}}" for i in range(1, 8)]
    path = tmp_path / "merge.yaml"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ConfigError, match=rf"merge.yaml: it means more than {MAX_VALUES} values"):
        load_file(path)
    small = tmp_path / "defaults.yaml"
    small.write_text("base: &base {lr: 0.1, name: SGD}\noptimizer: {<<: *base, lr: 0.2}\n")
    assert load_file(small)["optimizer"] == {"lr": 0.2, "name": "SGD"}  # the everyday use of merge keys


def test_self_referencing_alias_is_refused(tmp_path) -> None:
    path = tmp_path / "loop.yaml"
    path.write_text("prober_list: &a [*a]\n")
    with pytest.raises(ConfigError, match=r"loop.yaml: its lists and tables nest deeper than"):
        load_file(path)


def test_shared_values_under_the_bound_load(tmp_path) -> None:
    path = tmp_path / "ok.yaml"
    path.write_text('mods: &m ["q_proj", "v_proj"]\nlora: {target_modules: *m}\n')
    assert load_file(path)["lora"]["target_modules"] == ["q_proj", "v_proj"]


def test_a_huge_value_gives_a_short_message_naming_the_option(tmp_path) -> None:
    path = tmp_path / "big.yaml"
    path.write_text("optimizer:\n  lr: " + "9" * 200_000 + "x\n")
    with pytest.raises(ConfigError, match=r"optimizer\.lr: invalid value '9999") as info:
        TrainerConfig.from_file(path)
    assert len(str(info.value)) <= LONGEST and "expected float" in str(info.value)


def test_every_config_message_is_cut_to_a_readable_length() -> None:
    error = ConfigError("x: " + "y" * 100_000 + " fix: set x once.")
    assert len(str(error)) <= LONGEST
    assert str(error).startswith("x: yyy") and str(error).endswith("fix: set x once.")  # what and how kept
    assert "characters cut" in str(error)


def test_repeated_yaml_key_is_an_error_naming_it(tmp_path) -> None:
    path = tmp_path / "dup.yaml"
    path.write_text("total_step: 1\noptimizer:\n  lr: 0.001\n  lr: 0.9\n")
    with pytest.raises(ConfigError, match=r"dup.yaml: line 4: the key 'lr' is given twice in one table \(first on "
                                          r"line 3\)"):
        TrainerConfig.from_file(path)


def test_oversized_file_is_refused_before_it_is_read(tmp_path) -> None:
    path = tmp_path / "huge.yaml"
    with open(path, "wb") as handle:
        handle.truncate(5 << 20)  # sparse: no 5 MiB written
    with pytest.raises(ConfigError, match=r"huge.yaml: it is 5242880 bytes, more than"):
        load_file(path)


@pytest.mark.parametrize(("kwargs", "named"), [
    ({"lr": 0.9}, "kwargs.lr and lr"),
    ({"weight_decay": 0.5}, "kwargs.weight_decay and weight_decay"),
    ({"lr": 0.9, "weight_decay": 0.5}, "kwargs.lr and lr; kwargs.weight_decay and weight_decay"),
    ({"max-grad-norm": 2.0}, "kwargs.max-grad-norm and max_grad_norm"),
    ({"eps": 1e-6}, "kwargs.eps and eps"),
])
def test_optimizer_kwargs_may_not_repeat_a_field(kwargs, named) -> None:
    with pytest.raises(ConfigError, match=rf"optimizer\.kwargs: {named} set the same optimizer argument"):
        TrainerConfig.from_dict({"total_step": 1, "optimizer": {"lr": 0.001, "eps": 1e-8, "kwargs": kwargs}})


def test_optimizer_kwargs_for_arguments_without_a_set_field_pass() -> None:
    cfg = TrainerConfig.from_dict({"total_step": 1, "optimizer": {"name": "SGD", "lr": 0.1,
                                                                  "kwargs": {"momentum": 0.9}}})
    assert cfg.optimizer.optimizer_kwargs() == {"lr": 0.1, "weight_decay": 0.0, "momentum": 0.9}
    # eps is unset (none: the optimizer's default), so kwargs.eps replaces nothing
    cfg = TrainerConfig.from_dict({"total_step": 1, "optimizer": {"kwargs": {"eps": 1e-6}}})
    assert cfg.optimizer.optimizer_kwargs()["eps"] == 1e-6


@pytest.mark.parametrize("written", ["", "  "])
def test_an_empty_work_dir_is_an_error_not_the_default(written) -> None:
    with pytest.raises(ConfigError, match=r"work_dir: invalid value .*an empty path; write none for the default"):
        TrainerConfig.from_dict({"total_step": 1, "work_dir": written})
    assert TrainerConfig.from_dict({"total_step": 1, "work_dir": "none"}).work_dir == "work_dir"


def test_a_seed_past_numpy_range_is_refused_when_configured() -> None:
    with pytest.raises(ConfigError, match=r"seed: invalid value 18446744073709551616; expected int <= 4294967295"):
        TrainerConfig.from_dict({"total_step": 1, "seed": 2**64})
    assert TrainerConfig.from_dict({"total_step": 1, "seed": 2**32 - 1}).seed == 2**32 - 1


def test_toml_is_bounded_too(tmp_path) -> None:
    path = tmp_path / "deep.toml"
    path.write_text("prober_list = " + "[" * 40 + "]" * 40 + "\n")
    with pytest.raises(ConfigError, match=r"deep.toml: its lists and tables nest deeper than"):
        load_file(path)

