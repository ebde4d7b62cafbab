"""The errors minipar raises, so callers can catch exactly what went wrong."""


class MiniparError(RuntimeError):
    """Base class for minipar's own runtime errors."""


class NotInitializedError(MiniparError):
    """A collective or query was called before `minipar.init()` or after `finalize()`."""


class CommTimeoutError(MiniparError, TimeoutError):
    """A wait ran past the group's timeout. The message names what was awaited and from whom."""


class MessageSizeError(MiniparError):
    """A message arrived with a size other than the receive buffer expected."""


class MismatchError(MiniparError):
    """Ranks of a group called different collectives or passed different arguments (debug mode)."""
