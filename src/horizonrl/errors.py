"""The error every room may raise about the run's configuration; the bottom room, so that a room below
config.py (an engine refusing a model its backend cannot run) names a config problem as config.py does."""


class ConfigError(ValueError):
    """A configuration problem, with a message meant for the user."""
