"""A run's state on disk and in time, apart from the loop that trains it (train/): its checkpoints and the stop
signals that end it at one (`checkpoint.py`), its budget (`budget.py`) and the export of its final model
(`export.py`). The names of the files in a run folder are `horizonrl.runfolder`'s."""
