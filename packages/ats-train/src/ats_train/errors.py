"""The error a user can fix in their config: its own module, because the config sections (config/,
the orchestrator, faults and planning settings) and the code that checks settings at run time all
raise it, and the CLI turns it into one line and exit code 2 (internal bugs keep their traceback)."""


class ConfigError(ValueError):
    """A config file, override or value that cannot be used; the message names key and value."""


class RewardError(ValueError):
    """A GRPO reward function raised, or returned something that is not one finite number per
    completion (objectives/rewards.py)."""
