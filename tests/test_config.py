"""YAML + CLI -> dataclasses, TRL-style, with unknown keys caught."""

import hashlib

import pytest
from helpers import REPO

from grpo_recipes.config.parsing import device_defaults
from grpo_recipes.config.resolve import resolve
from grpo_recipes.errors import ConfigError

DEFAULT = REPO / "recipes/configs/math_cpu.yaml"


def test_default_config_parses_and_cli_overrides_it():
    config = resolve(["--learning_rate", "3e-6", "--rewards", '[{"name": "math_correctness", "weight": 2}]'], DEFAULT)
    recipe, grpo, model, path = config.recipe, config.training, config.model, config.path
    assert path == DEFAULT and grpo.learning_rate == 3e-6
    assert model.model_name_or_path == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert [(s.name, s.weight) for s in recipe.reward_specs] == [("math_correctness", 2.0)]
    assert recipe.gym_params["max_digits"] == 1
    assert grpo.bf16 is False  # no bf16-capable GPU here: picked off, not forced on
    # The default config as a str (scripts and tests pass one) resolves to the same run, name included.
    assert resolve(["--learning_rate", "3e-6"], str(DEFAULT)).training.run_name == resolve(["--learning_rate", "3e-6"],
                                                                                              DEFAULT).training.run_name


def test_explicit_config_replaces_the_default(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("output_dir: /tmp/x\nrewards: [think_format]\nenv: {GRPO_RECIPES_TEST_VAR: on-file}\n")
    config = resolve(["--config", str(cfg)], DEFAULT)
    recipe, grpo, _, path = config.recipe, config.training, config.model, config.path
    assert path == cfg and recipe.reward_specs[0].name == "think_format" and grpo.output_dir == "/tmp/x"
    import os
    assert os.environ.pop("GRPO_RECIPES_TEST_VAR") == "on-file"


def test_unknown_keys_get_did_you_mean(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("learning_rat: 1e-6\nnum_generation: 4\n")
    with pytest.raises(ConfigError) as err:
        resolve(["--config", str(cfg)])
    assert "did you mean `learning_rate`" in str(err.value) and "did you mean `num_generations`" in str(err.value)
    with pytest.raises(ConfigError, match="did you mean `max_steps`"):
        resolve(["--max_step", "3"], DEFAULT)


def test_run_name_is_derived_from_the_config():
    """A run is named for what its flags or config file changed from the recipe's default config, then its seed; its
    Trackio group is that name without the seed."""
    def named(*argv, config=DEFAULT):
        resolved = resolve(list(argv), config, name="math")
        return resolved.training.run_name, resolved.recipe.trackio_group

    assert named("--seed", "7") == ("seed7", "defaults")
    assert named() == ("seed42", "defaults")  # the default config's seed
    assert named("--learning_rate", "2e-5", "--seed", "1") == ("lr2e-5-seed1", "lr2e-5")
    assert named("--learning_rate", "1e-5", "--seed", "1") == ("seed1", "defaults")  # the default config's own value
    cut = "beta0.04+" + hashlib.sha1(b"loss_type=grpo").hexdigest()[:4]  # "beta0.04-loss_type=grpo": too long
    assert named("--beta", "0.04", "--loss_type", "grpo") == (f"{cut}-seed42", cut)
    # Where it is written, logged, saved or resumed does not tell runs apart.
    assert named("--output_dir", "elsewhere", "--logging_steps", "2", "--save_steps", "3", "--seed", "3",
                 "--trackio_dir", "tracks")[0] == "seed3"
    assert named("--run_name", "mine") == ("mine", "defaults")
    assert named("--trackio_group", "sweep-a", "--seed", "2") == ("seed2", "sweep-a")
    assert named("--report_to", "none") == ("seed42", None)  # no Trackio run to group
    assert resolve(["--seed", "7"], DEFAULT, name="math").training.project == "grpo-recipes-math"


def test_run_name_of_another_config_file_and_a_long_change_fits_the_sidebar(tmp_path, monkeypatch):
    mine = tmp_path / "my_config.yaml"
    mine.write_text(DEFAULT.read_text())
    assert resolve(["--config", str(mine), "--seed", "3"], DEFAULT, name="math").training.run_name == "my_config-seed3"
    monkeypatch.chdir(REPO)  # the recipe's own config, named on the command line by another path
    own = resolve(["--config", str(DEFAULT.relative_to(REPO)), "--seed", "3"], DEFAULT, name="math")
    assert own.training.run_name == "seed3"
    # Many changes: the first that fit, then `+` and a digest of the rest, so that runs differing only there differ.
    flags = ["--model_name_or_path", "some/where/tiny_llama0", "--max_steps", "3", "--num_generations", "4"]
    names = [resolve([*flags, *more, "--seed", seed], DEFAULT, name="math").training.run_name
             for more in ([], ["--temperature", "0.7"]) for seed in ("1", "2")]
    assert len(set(names)) == 4 and all(n.startswith("tiny_llama0+") and len(n) <= 24 for n in names), names
    assert names[0][:-1] == names[1][:-1] != names[2][:-1] == names[3][:-1]  # the digest differs, the seed ends it


def test_paths_in_a_config_file_are_relative_to_the_file(tmp_path, monkeypatch):
    (tmp_path / "sub").mkdir()
    cfg = tmp_path / "sub" / "c.yaml"
    cfg.write_text("dataset_source: file\ndataset_path: data/rows.jsonl\n")
    monkeypatch.chdir(tmp_path)
    config = resolve(["--config", str(cfg)])
    recipe = config.recipe
    assert recipe.dataset_path == str(tmp_path / "sub" / "data" / "rows.jsonl")
    config = resolve(["--config", str(cfg), "--dataset_path", "cli.jsonl"])
    recipe = config.recipe
    assert recipe.dataset_path == "cli.jsonl"  # a CLI path is the user's, relative to where they stand


def test_reward_dirs_in_a_config_file_are_relative_to_the_file(tmp_path, monkeypatch):
    from grpo_recipes.rewards import registry

    folder = tmp_path / "sub" / "my_rewards"
    folder.mkdir(parents=True)
    (folder / "config_relative.py").write_text(
        "from grpo_recipes.rewards.registry import reward\n\n"
        "@reward('config_relative_reward')\n"
        "def config_relative_reward(completions):\n"
        "    return [1.0 for _ in completions]\n"
    )
    cfg = tmp_path / "sub" / "c.yaml"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # not where the config is: a cwd-relative reading would find nothing
    for value in ("my_rewards", "[my_rewards]"):  # one folder, or a list of them
        cfg.write_text(f"reward_dirs: {value}\n")
        config = resolve(["--config", str(cfg)])
        recipe = config.recipe
        assert recipe.reward_dirs == [str(folder)]
    assert "config_relative_reward" in registry.available(recipe.reward_dirs)
    config = resolve(["--config", str(cfg), "--reward_dirs", "cli_rewards"])
    recipe = config.recipe
    assert recipe.reward_dirs == ["cli_rewards"]  # a CLI path is the user's, relative to where they stand


def test_config_is_named_the_same_ways_the_launcher_accepts(tmp_path):
    from grpo_recipes.config.files import split_config_arg

    cfg = tmp_path / "c.yaml"
    cfg.write_text("learning_rate: 2.0e-6\n")
    for argv in (["--config", str(cfg)], [f"--config={cfg}"]):
        config = resolve([*argv, "--seed", "3"], DEFAULT)
        grpo, path = config.training, config.path
        assert path == cfg and grpo.learning_rate == 2e-6 and grpo.seed == 3
    assert split_config_arg(["--x", "1", f"--config={cfg}"]) == (cfg, ["--x", "1"])
    assert split_config_arg(["--x", "1"], DEFAULT) == (DEFAULT, ["--x", "1"])
    with pytest.raises(ConfigError, match="--config: given 2 times"):
        resolve(["--config", str(cfg), f"--config={cfg}"])
    with pytest.raises(ConfigError, match="--config: missing the path"):
        resolve(["--config"])
    with pytest.raises(ConfigError, match="--config: no such file"):
        resolve(["--config", str(tmp_path / "missing.yaml")])


def test_several_processes_without_cuda_train_as_cpu_ranks(monkeypatch):
    # accelerate_configs/cpu_ddp.yaml starts its workers through torchrun; without use_cpu each would train alone.
    # (Parsing with WORLD_SIZE=2 would start the process group; the slow two-process test runs that for real.)
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert device_defaults() == {"bf16": False}
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert device_defaults() == {"bf16": False, "use_cpu": True}
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    monkeypatch.setattr("torch.cuda.is_bf16_supported", lambda: True)
    assert device_defaults() == {"bf16": True}


def _snapshot(config) -> list:
    from dataclasses import asdict

    return [asdict(config.recipe), config.training.to_dict(), asdict(config.model),
            [(s.name, s.index, s.last, s.training.to_dict()) for s in config.stages]]


def test_the_resolved_config_is_what_the_run_trains_with(run_env):
    """Resolved once: checking the config, planning the start, loading the data, compiling the rewards and building
    the stages rewrite none of it (the task's defaults, the format reward, the reward weights, the run's name and the
    earlier stages' configs are all decided by resolve)."""
    from grpo_recipes.run import runner

    argv = ["--output_dir", str(run_env / "out"), "--train_size", "40", "--eval_size", "8"]
    fresh = resolve(argv, DEFAULT, name="math")
    run = runner.prepare("math", argv, DEFAULT)
    assert _snapshot(run.config) == _snapshot(fresh)
    assert run.recipe.format_reward == "boxed_format" and "format_reward" not in fresh.explicit  # the role's reward
    assert run.training.reward_weights == [s.weight for s in run.recipe.reward_specs]
    assert [s.spec.training.run_name for s in run.stages] == [run.training.run_name] * 2  # one Trackio run
    assert run.training.model_init_kwargs == {"dtype": "float32"}  # ModelConfig's, for every stage
    assert run.stages[0].spec.training.model_init_kwargs == {"dtype": "float32"}


def test_the_task_fills_what_the_config_leaves_unset(tmp_path):
    """Precedence: the command line, the file, the task's defaults, the fields' own."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text("task: arithmetic\neval_size: 7\n")
    config = resolve(["--config", str(cfg), "--train_size", "9"])
    assert config.name == "arithmetic" and config.task is not None
    assert (config.recipe.eval_size, config.recipe.train_size) == (7, 9)  # the file's, the flag's
    assert [s.name for s in config.recipe.reward_specs] == ["math_correctness", "boxed_format"]  # the task's
    assert config.recipe.correctness_reward == "math_correctness"
    config = resolve(["--config", str(cfg), "--rewards", '["boxed_format"]'])
    assert config.recipe.correctness_reward is None  # the task's roles name its rewards, which the flag replaced
