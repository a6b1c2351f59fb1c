import pytest

from horizonrl.config import ConfigError, default_recipe, dump, load_config, validate


def test_default_recipe_loads_and_its_first_line_is_its_command():
    path = default_recipe()
    assert path.read_text().splitlines()[0] == "# horizonrl train configs/toy.yaml"
    cfg = load_config()
    assert cfg.env.id == "river" and cfg.model.path is None and cfg.model.warm_start is not None


def test_dotted_overrides_are_parsed_as_yaml():
    cfg = load_config(None, ["ppo.actor_lr=1e-4", "rollout.n_env=8", "ppo.dual_clip=null", "name=x y"])
    assert cfg.ppo.actor_lr == 1e-4 and cfg.rollout.n_env == 8 and cfg.ppo.dual_clip is None and cfg.name == "x y"


@pytest.mark.parametrize("override,message", [
    (["ppo.acto_lr=1"], "ppo.acto_lr: unknown key"),
    (["ppo.actor_lr=abc"], "ppo.actor_lr: Input should be a valid number"),
    (["rollout.n_env=-2"], "rollout.n_env: Input should be greater than 0"),
    (["ppo.loss_agg=mean"], "ppo.loss_agg: Input should be 'token-mean', 'seq-mean-token-sum' or 'seq-mean-token-mean'"),
    (["ppo.mini_batch_size=100"], "not divisible by ppo.mini_batch_size = 100"),
    (["model.path=Qwen/Qwen2.5-0.5B-Instruct"], "model: warm_start trains the tiny model from scratch"),
    (["rollout=3"], "rollout: Input should be a valid dictionary"),
    (["env.id=rivr"], "env: unknown env 'rivr'; known envs: babaisai/goto_win-distr_obj"),
    (["env.kwargs.stone=3"], "env: kwargs do not fit env 'river': got an unexpected keyword argument 'stone'"),
    (["novalue"], "override 'novalue' is not of the form key=value"),
    (["task.source=horizonrl.tasks.arithmetic:make_task"], "agent-loop tasks train with a group algorithm"),
    (["algorithm=grpo", "task.source=horizonrl.tasks.arithmetic:make_task"],
     "task.teacher is needed to build a tiny model for a task (or set model.path)"),
    (["agent.feedback=continuation"], "agent: feedback=continuation needs history=full"),
])
def test_bad_values_name_the_key(override, message):
    with pytest.raises(ConfigError) as error:
        load_config(None, override)
    assert message in str(error.value)
    assert "Traceback" not in str(error.value)


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("ppo: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)


def test_dump_round_trips():
    import yaml

    cfg = load_config()
    assert validate(yaml.safe_load(dump(cfg))) == cfg
