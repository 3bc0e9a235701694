"""The error a user can fix in their config: its own module, because the config sections (config/,
the orchestrator, faults and planning settings) and the code that checks settings at run time all
raise it, and the CLI turns it into one line and exit code 2 (internal bugs keep their traceback)."""


class ConfigError(ValueError):
    """A config file, override or value that cannot be used; the message names key and value."""


class RewardError(ValueError):
    """A GRPO reward function raised, or returned something that is not one finite number per
    completion (objectives/rewards.py)."""


class InputError(ValueError):
    """A model or adapter directory given to a command that cannot be used (an adapter for another
    model shape, a corrupt file); the message names the file and what is wrong."""


class DivergedError(RuntimeError):
    """The loss or gradients stayed non-finite through orchestrator.rollback.max_rollbacks
    rollbacks: the run cannot get past that point; the message names the step and what was tried."""
