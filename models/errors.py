"""The error of a bad model option."""


class ModelConfigError(ValueError):
    """A bad model option; the message is one line naming the value and the valid choices."""


class BackboneOptionError(ModelConfigError):
    """A bad combination of a backbone's own options, named in the message as ``<option>=<value>``; the
    classification module names them by their config keys (``model.net.<option>``)."""

    def __init__(self, message: str, options: tuple[str, ...]) -> None:
        super().__init__(message)
        self.options = options

    def named(self, prefix: str) -> str:
        """The message with each ``<option>=`` as ``<prefix><option>=``."""
        import re

        return re.sub(rf"(?<![\w.])({'|'.join(map(re.escape, self.options))})=", rf"{prefix}\1=", str(self))
