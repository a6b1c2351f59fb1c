"""What a training run is built from, apart from the loop that runs it (train/): the run context (`context.py`:
models, optimizers, engine, collector, loss functions, from the config), the run's collector (`collectors.py`)
and its producer process (`producer_process.py`), the warm starts of a tiny model (`warm_start.py`) and of a task's
(`tasks.py`), and the served-policy check the loop runs after every weight sync (`sync_check.py`)."""
