"""The errors minipar raises, so callers can catch exactly what went wrong."""


class MiniparError(RuntimeError):
    """Base class for minipar's own runtime errors."""


class NotInitializedError(MiniparError):
    """A collective or query was called before `minipar.init()` or after `finalize()`."""

    def __init__(self, message: str = ""):
        super().__init__(
            message
            or "minipar is not initialised: call minipar.init() first (and not after finalize())"
        )


class CommTimeoutError(MiniparError, TimeoutError):
    """A wait ran past the group's timeout. The message names what was awaited and from whom."""


class MessageSizeError(MiniparError):
    """A message arrived with a size other than the receive buffer expected."""


class MismatchError(MiniparError):
    """Ranks of a group called different collectives or passed different arguments (debug mode)."""


class MPISetupError(MiniparError):
    """The MPI set-up is wrong before any message moves: no MPI library, or a launcher from
    another MPI than the library mpi4py loaded (see minipar.comm.setup.mpisetup)."""


class RankError(MiniparError):
    """A rank of a job started by `minipar.launch` raised; the message holds its traceback."""

    def __init__(self, message: str, rank: int | None = None):
        super().__init__(message)
        self.rank = rank
