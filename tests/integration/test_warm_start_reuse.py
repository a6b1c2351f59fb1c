"""A warm-started tiny model trains the same from its folder: a run with `model.path=RUN/init` and
`model.warm_start=null` gives the metrics of the run that warm-started it in place, because training draws from
random streams of its own (env seeds that do not depend on the warm start, rollout/seeds.py; the engine's request
seeds; the mini-batch shuffle's generator), and the folder holds the model exactly (fp32 safetensors).
And a group run with no iteration warm-starts the same model as a PPO run of the same recipe and seed (the
same streams). The learning tests build the toy recipe's warm start once this way (tests/learning/conftest.py)."""

from safetensors.torch import load_file

from horizonrl.config import SOURCE_CONFIGS, load_config
from horizonrl.train.loop import train
from test_resume import assert_same_records

TOY = str(SOURCE_CONFIGS / "toy.yaml")
SMALL = ["rollout.n_env=8", "ppo.e_len=4", "optim.mini_batch_size=32", "critic.warmup_batches=1",
         "critic.warmup_iters=1", "model.warm_start.steps=20", "model.warm_start.iterations=1", "save_every=0"]


def run(tmp_path, name: str, *overrides: str):
    return train(load_config(TOY, [*SMALL, *overrides, f"output_dir={tmp_path / name}"]), progress=False)


def test_a_run_from_the_saved_warm_start_trains_as_the_run_that_made_it(tmp_path):
    in_place = run(tmp_path, "in_place", "iterations=2")
    made_by_groups = run(tmp_path, "groups", "algorithm=grpo", "iterations=0")
    weights = [load_file(r / "init" / "model.safetensors") for r in (in_place, made_by_groups)]
    assert weights[0].keys() == weights[1].keys() and all(weights[0][k].equal(weights[1][k]) for k in weights[0])

    from_folder = run(tmp_path, "from_folder", "iterations=2", f"model.path={made_by_groups / 'init'}",
                      "model.warm_start=null")
    assert_same_records(from_folder, in_place)
