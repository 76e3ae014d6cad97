"""The one error class of sequence parallelism: bad shapes or degrees, named with the module and the numbers."""


class SequenceParallelError(ValueError):
    """A tensor or a degree that Ulysses sequence parallelism cannot split; the message says how to fix it."""


def check_divisible(what: str, count: int, degree: int, where: str, fix: str) -> None:
    """Raise when ``count`` (of ``what``) does not split evenly over ``degree`` ranks of ``where``."""
    if degree < 1:
        raise SequenceParallelError(f"{where}: the sequence-parallel degree must be at least 1, got {degree}")
    if count % degree:
        raise SequenceParallelError(
            f"{where}: {what} ({count}) is not divisible by the sequence-parallel degree ({degree}); {fix}"
        )


def check_degree(world_size: int, degree: int, where: str = "sequence_parallel_size") -> None:
    """Raise when the sequence-parallel degree does not divide the number of ranks."""
    if degree < 1 or world_size % degree:
        raise SequenceParallelError(
            f"{where}: the sequence-parallel degree {degree} does not divide the world size {world_size}; "
            f"use a degree that divides {world_size} (each group of {degree} consecutive ranks shares a sequence)"
        )
