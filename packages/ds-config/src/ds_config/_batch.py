"""Batch-size derivation, exactly as DeepSpeed's ``_set_batch_related_parameters`` + ``_batch_assertion``."""

from __future__ import annotations

from dataclasses import dataclass

from ._errors import ConfigError, ConfigProblem

__all__ = ["BatchSizes", "derive_batch_sizes"]

TBS, MBS, GAS = "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"


@dataclass(frozen=True)
class BatchSizes:
    """A consistent batch triple: ``train_batch_size == micro * gas * world_size``."""

    train_batch_size: int
    train_micro_batch_size_per_gpu: int
    gradient_accumulation_steps: int
    world_size: int
    world_size_source: str


def derive_batch_sizes(
    train_batch_size: int | None,
    train_micro_batch_size_per_gpu: int | None,
    gradient_accumulation_steps: int | None,
    world_size: int,
    world_size_source: str = "explicit argument",
) -> BatchSizes:
    """Fill in the missing batch sizes for a data-parallel ``world_size`` and check the result.

    The seven cases of docs/design.md §1, in order (integer floor division), then the assertions in
    DeepSpeed's order; the first failing assertion is reported. Raises :class:`ConfigError` naming the
    three numbers, where the world size came from, and a consistent triple to use instead.
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ConfigError([ConfigProblem("world_size", "expected an integer >= 1", world_size)])
    tbs, mbs, gas, w = (
        train_batch_size,
        train_micro_batch_size_per_gpu,
        gradient_accumulation_steps,
        world_size,
    )
    too_small = _too_small_to_split(tbs, mbs, gas, w, world_size_source)
    if too_small is not None:
        raise ConfigError([too_small])
    if tbs is not None and mbs is not None and gas is not None:
        pass  # 1. all three given: nothing derived
    elif tbs is not None and mbs is not None:
        gas = (tbs // mbs) // w if mbs else 0  # 2. (a zero micro batch fails its assertion below)
    elif tbs is not None and gas is not None:
        mbs = (tbs // w) // gas if gas else 0  # 3.
    elif mbs is not None and gas is not None:
        tbs = mbs * gas * w  # 4.
    elif tbs is not None:
        gas, mbs = 1, tbs // w  # 5.
    elif mbs is not None:
        gas, tbs = 1, mbs * w  # 6.
    else:  # 7.
        raise ConfigError(
            [
                ConfigProblem(
                    TBS,
                    f"either {TBS} or {MBS} needs to be provided "
                    f'(for example "{MBS}": 1 with {GAS} derived as 1 gives {TBS} = 1 * 1 * {w})',
                )
            ]
        )
    given = (train_batch_size, train_micro_batch_size_per_gpu, gradient_accumulation_steps)
    problem = _first_failed_assertion(tbs, mbs, gas, w, world_size_source, given)
    if problem is not None:
        raise ConfigError([problem])
    return BatchSizes(tbs, mbs, gas, w, world_size_source)


def _triple(tbs: int, mbs: int, gas: int, w: int) -> str:
    return f'"{TBS}": {tbs}, "{MBS}": {mbs}, "{GAS}": {gas} (= {mbs} * {gas} * {w})'


def _too_small_to_split(
    tbs: int | None, mbs: int | None, gas: int | None, w: int, source: str
) -> ConfigProblem | None:
    """A train_batch_size too small for the given micro batch (or accumulation steps) and world size.

    Derivation would floor the missing key to 0 and report a value the user never wrote; this says
    it in the user's own numbers instead, with a consistent triple that keeps train_batch_size when
    the world size divides it, and one that keeps the user's other key.
    """
    if tbs is None or tbs < 1 or (mbs is None) == (gas is None):
        return None  # not case 2 or 3 (or a bound error the models report)
    given_name, given = (MBS, mbs) if mbs is not None else (GAS, gas)
    if given < 1 or tbs >= given * w:
        return None
    options = []
    if tbs % w == 0:
        options.append(_triple(tbs, tbs // w, 1, w))
    options.append(_triple(given * w, given, 1, w) if given_name == MBS else _triple(gas * w, 1, gas, w))
    return ConfigProblem(
        TBS,
        f"{TBS} {tbs} is smaller than {given_name} * world_size = {given} * {w} = {given * w} "
        f"(world size {w} from {source}); a consistent choice is " + ", or ".join(options),
        tbs,
    )


def _first_failed_assertion(
    tbs: int, mbs: int, gas: int, w: int, source: str, given: tuple[int | None, ...]
) -> ConfigProblem | None:
    where = f"world size {w} from {source}"
    if tbs <= 0:
        return ConfigProblem(TBS, f"Train batch size: {tbs} has to be greater than 0 ({where})", tbs)
    if mbs <= 0:
        hint = _proposal(tbs, mbs, gas, w, given)
        return ConfigProblem(
            MBS, f"Micro batch size per gpu: {mbs} has to be greater than 0 ({where}); {hint}", mbs
        )
    if gas <= 0:
        hint = _proposal(tbs, mbs, gas, w, given)
        return ConfigProblem(
            GAS, f"Gradient accumulation steps: {gas} has to be greater than 0 ({where}); {hint}", gas
        )
    if tbs != mbs * gas * w:
        return ConfigProblem(
            TBS,
            f"{TBS} is not equal to {MBS} * {GAS} * world_size: {tbs} != {mbs} * {gas} * {w} "
            f"({where}); {_proposal(tbs, mbs, gas, w, given)}",
            tbs,
        )
    return None


def _proposal(tbs: int, mbs: int, gas: int, w: int, given: tuple[int | None, ...]) -> str:
    """Consistent triples close to the given one that keep as many of the values the user set as any
    consistent triple at this world size can (the user's gradient_accumulation_steps included)."""
    g_tbs, g_mbs, g_gas = (v if v is not None and v > 0 else None for v in given)
    candidates: list[tuple[int, int, int]] = []
    if g_mbs and g_gas:
        candidates.append((g_mbs * g_gas * w, g_mbs, g_gas))
    if g_tbs and g_mbs and g_tbs % (g_mbs * w) == 0:
        candidates.append((g_tbs, g_mbs, g_tbs // (g_mbs * w)))
    if g_tbs and g_gas and g_tbs % (g_gas * w) == 0:
        candidates.append((g_tbs, g_tbs // (g_gas * w), g_gas))
    if g_gas:
        m = max(1, round(tbs / (g_gas * w)))
        candidates.append((m * g_gas * w, m, g_gas))
    if mbs > 0:  # the micro batch (given or derived) with the accumulation that comes closest to tbs
        new_gas = max(1, round(tbs / (mbs * w)))
        candidates.append((mbs * new_gas * w, mbs, new_gas))
    if g_tbs and g_tbs % w == 0:  # the global batch, split with accumulation near the user's (or 1)
        per_rank = g_tbs // w
        divisors = [d for d in range(1, per_rank + 1) if per_rank % d == 0]
        d = min(divisors, key=lambda d: (abs(d - (g_gas or gas if gas > 0 else 1)), d))
        candidates.append((g_tbs, per_rank // d, d))
    if not candidates:
        new_gas = max(1, gas)
        new_mbs = max(1, tbs // (w * new_gas))
        candidates.append((new_mbs * new_gas * w, new_mbs, new_gas))

    def kept(triple: tuple[int, int, int]) -> int:
        return sum(v is not None and v == t for v, t in zip((g_tbs, g_mbs, g_gas), triple))

    best = max(kept(c) for c in candidates)
    chosen = list(dict.fromkeys(c for c in candidates if kept(c) == best))[:3]
    text = "a consistent choice is " + ", or ".join(
        f'"{TBS}": {t}, "{MBS}": {m}, "{GAS}": {g} (= {m} * {g} * {w})' for t, m, g in chosen
    )
    if mbs > 0 and gas > 0 and tbs % (mbs * gas) == 0 and tbs // (mbs * gas) != w:
        text += f", or run on a world size of {tbs // (mbs * gas)}"
    return text
