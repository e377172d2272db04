"""Role plans: the roles of one step's saves, replayed by position in the steps after it.

A cache whose rules ask for roles runs its ``with`` block under a
:class:`~actzip.memory.cache.roles.RoleTracker`, a torch function mode that every torch call of the forward goes
through. A training loop saves the same tensors in the same order every step, so after one tracked step the cache
knows each save's role by its position. :class:`RolePlan` records those roles (a tracked step) and hands them
out in the next steps (replayed steps, no tracker): the rules then decide exactly as they would under the tracker,
with that role.

Each replayed save is checked against the recorded one: same dtype, same number of dimensions, same
``requires_grad``, and made by the same kind of autograd node (``type(t.grad_fn)``). Shapes are not compared, so
batches of varying length replay too. A save that does not match, or one past the recorded ones, ends the replay
for the rest of that step: those saves are kept as they are (exact, never a role guessed), counted as
``unplanned`` in the step's account, announced once per cache, and the next step is tracked again. Every
``lifetime`` steps the plan is recorded afresh anyway (``CacheConfig.recheck_every``; ``CacheConfig(replay=False)``
tracks every step).
"""

from __future__ import annotations

import warnings

import torch

from actzip.memory.cache.roles import current_role

__all__ = ["UNPLANNED", "RolePlan", "save_signature"]

UNPLANNED = "unplanned"  # the account's name for saves kept because they did not match the plan


def save_signature(t: torch.Tensor) -> tuple:
    """What a replayed save must share with the recorded one at its position."""
    node = t.grad_fn
    return (t.dtype, t.dim(), t.requires_grad, None if node is None else type(node))


class RolePlan:
    """The roles of a tracked step's saves in order, handed out by position in the ``lifetime`` steps after it.

    Per step: :meth:`start` (whether the step replays, so needs no tracker), :meth:`role` once per save in
    order (inside the save's role query), :meth:`finish`.
    """

    def __init__(self, lifetime: int) -> None:
        self.lifetime = lifetime  # replayed steps per recording (0: never replay)
        self.misses = 0  # replayed steps that ended early on a save that did not match
        self.replayed_steps = 0
        self._plan: list[tuple[tuple, str]] = []  # (signature, role) of each save of the recorded step
        self._recording: list[tuple[tuple, str]] = []
        self._age = 0  # steps replayed since the plan was recorded
        self._replaying = False
        self._position = 0
        self._missed = False
        self._announced = False

    @property
    def replaying(self) -> bool:
        """Whether the open step takes its roles from the plan."""
        return self._replaying

    def start(self) -> bool:
        """Begin a step: ``True`` if it replays the plan (no tracker needed), ``False`` if it records one."""
        self._position, self._missed = 0, False
        self._replaying = bool(self._plan) and self._age < self.lifetime
        if not self._replaying:
            self._recording = []
        return self._replaying

    def role(self, t: torch.Tensor) -> str | None:
        """The role of ``t``, the next save of the step: the tracker's (recording), the plan's (replaying), or
        ``None`` once the replayed step has left the plan (the save is then kept as it is)."""
        if not self._replaying:
            role = current_role(t)
            self._recording.append((save_signature(t), role))
            return role
        i = self._position
        self._position = i + 1
        if not self._missed and i < len(self._plan):
            signature, role = self._plan[i]
            if signature == save_signature(t):
                return role
        if not self._missed:
            self._missed = True
            self.misses += 1
            self._announce(i, t)
        return None

    def finish(self, completed: bool) -> None:
        """End a step (``completed``: its block ran to the end, so a recording may become the plan)."""
        if self._replaying:
            self.replayed_steps += 1
            self._age += 1
            if self._missed or self._position != len(self._plan):
                self._plan = []  # the next step records again
        elif completed and self.lifetime > 0:
            self._plan, self._age = self._recording, 0
        self._recording = []
        self._replaying = False

    def _announce(self, position: int, t: torch.Tensor) -> None:
        if self._announced:
            return
        self._announced = True
        recorded = f"{len(self._plan)} recorded" if position >= len(self._plan) else \
            f"recorded {self._plan[position][0]}, got {save_signature(t)}"
        warnings.warn(f"actzip.cache: save {position} of this step does not follow the step whose roles the cache "
                      f"replays ({recorded}); the rest of this step's saves are kept as they are (counted as "
                      f"'{UNPLANNED}' in the account) and the next step is tracked again (warned once per cache; "
                      "CacheConfig(replay=False) tracks every step)", RuntimeWarning, stacklevel=4)
