"""The error of a bad model option."""


class ModelConfigError(ValueError):
    """A bad model option; the message is one line naming the value and the valid choices."""
