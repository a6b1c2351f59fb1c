"""The names inside a run folder, one place for every room that writes or reads one: training writes them;
`eval`, `export`, `report`, `view` and `--resume` read them.

    RUN/config.yaml                the run's resolved config
    RUN/metrics.jsonl              one record per iteration
    RUN/trajectories.jsonl         sample episodes of each iteration
    RUN/validation.jsonl           one line per validation (train/validation.py)
    RUN/merge_mismatches.jsonl     each prefix mismatch of merged samples (merge.debug)
    RUN/init/                      the policy the run starts from, when it made one (a warm start)
    RUN/checkpoint/                the last policy, a Hugging Face model folder
    RUN/best/                      the policy its validation kept
    RUN/checkpoints/iter_NNNNNN/   the checkpoints a run resumes from (runstate/checkpoint.py)
    RUN/engine_weights/            the rollout engine's copy of the weights while the run lasts
"""

CONFIG = "config.yaml"
METRICS = "metrics.jsonl"
TRAJECTORIES = "trajectories.jsonl"
VALIDATIONS = "validation.jsonl"
MERGE_MISMATCHES = "merge_mismatches.jsonl"
INIT = "init"
CHECKPOINT = "checkpoint"
BEST = "best"
CHECKPOINTS = "checkpoints"
ENGINE_WEIGHTS = "engine_weights"
