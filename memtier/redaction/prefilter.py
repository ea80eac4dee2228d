"""The pre-filter: run only the detectors that could match, decided by cheap substring searches.

Every :class:`~memtier.redaction.detectors.Detector` declares pre-filters (``chars``,
``needles``, ``hints``, ``gate``), each a NECESSARY condition for a match: a detector whose
filter fails cannot match, so skipping it changes nothing (``tests/test_redaction_prefilter.py``
checks every match against its filters, and that redaction without them is the same).
Empty filters mean "always run".

Why: the patterns start with one literal character followed by a lookbehind, so the regex
engine stops at every occurrence of that (often common) character; a substring search for a
longer literal is 3-10x cheaper than running the pattern, and most chat text passes none.

The filters are checked on the *current* text before every run, so a replacement made by an
earlier detector is seen.

Most text passes no filter, so the first look decides for every detector at once, with
searches that run in C (``filter(text.__contains__, ...)``, no bytecode per search): which
of the detectors' characters occur (one memchr each), then, among the detectors whose
characters all occur, which of their needles and hints do.  That names the candidates;
each is checked in full, in order, before it runs.  Until a detector replaces something the
text is the one the first look saw, so a detector it ruled out would have failed its
filters in the loop too; after a replacement the remaining detectors are checked one by
one on the new text, as before (:func:`_run_from`).  What the first look needs of a set of
characters present (a :class:`_Stage`) is worked out once per detector list and set.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import chain

from memtier.redaction.detectors import Detector
from memtier.redaction.placeholders import SecretKind

__all__ = ["run_filtered"]

Run = Callable[[Detector, str, dict[SecretKind, int]], "str | None"]

# Bounds of the memos: stages per detector list (one per set of characters present; the
# shipped list has 11 distinct characters, so at most 2,048 sets), and detector lists.
_MAX_STAGES = 4096
_MAX_PLANS = 8


class _Stage:
    """For one set of the detectors' characters present: the needles and hints worth a
    search, the detectors each names, and the detectors with neither (always candidates)."""

    __slots__ = ("always", "hint_owners", "hints", "needle_owners", "needles")

    def __init__(self, detectors: Sequence[Detector], present: frozenset[str]) -> None:
        needle_owners: dict[str, list[int]] = {}
        hint_owners: dict[str, list[int]] = {}
        always: list[int] = []
        for index, detector in enumerate(detectors):
            if not present.issuperset(detector.chars):
                continue
            if not detector.needles and not detector.hints:
                always.append(index)
            for needle in detector.needles:
                needle_owners.setdefault(needle, []).append(index)
            for hint in detector.hints:
                hint_owners.setdefault(hint, []).append(index)
        self.needles = tuple(needle_owners)
        self.needle_owners = {k: tuple(v) for k, v in needle_owners.items()}
        self.hints = tuple(hint_owners)
        self.hint_owners = {k: tuple(v) for k, v in hint_owners.items()}
        self.always = tuple(always)


class _Plan:
    __slots__ = ("chars", "detectors", "stages")

    def __init__(self, detectors: Sequence[Detector]) -> None:
        self.detectors = detectors
        self.chars = tuple(sorted({c for d in detectors for c in d.chars}))
        self.stages: dict[frozenset[str], _Stage] = {}

    def stage(self, text: str) -> _Stage:
        present = frozenset(filter(text.__contains__, self.chars))
        found = self.stages.get(present)
        if found is None:
            found = _Stage(self.detectors, present)
            if len(self.stages) < _MAX_STAGES:
                self.stages[present] = found
        return found


_PLANS: dict[int, _Plan] = {}


def _plan(detectors: Sequence[Detector]) -> _Plan:
    plan = _PLANS.get(id(detectors))
    if plan is None or plan.detectors is not detectors:  # (an id reused by a new list)
        plan = _Plan(detectors)
        if len(_PLANS) >= _MAX_PLANS:
            _PLANS.clear()  # (only tests pass other lists; one clear, no iteration to race)
        _PLANS[id(detectors)] = plan  # the plan keeps its list alive: the id stays its own
    return plan


def run_filtered(
    detectors: Sequence[Detector],
    text: str,
    run: Run,
    counts: dict[SecretKind, int],
) -> str:
    """Call ``run(detector, text, counts)`` for each detector, in order, whose filters pass on
    the current text; returns the text after the last one.

    ``run`` returns the new text if the detector replaced something, else None: the filters
    of the detectors after it are checked on the text as it is then.  (``counts`` is passed
    through so that ``run`` needs no closure built per call.)
    """
    stage = _plan(detectors).stage(text)
    # (filter/map over bound methods: every search and lookup runs in C)
    named = list(map(stage.needle_owners.__getitem__, filter(text.__contains__, stage.needles)))
    if stage.hints:
        lowered = text.lower()
        named += map(stage.hint_owners.__getitem__, filter(lowered.__contains__, stage.hints))
    if not named and not stage.always:
        return text
    for index in sorted(set(chain(stage.always, *named))):
        detector = detectors[index]
        if not _passes(detector, text):
            continue
        changed = run(detector, text, counts)
        if changed is not None:  # the text changed: the rest one by one, on the new text
            return _run_from(detectors, index + 1, changed, run, counts)
    return text


def _passes(detector: Detector, text: str) -> bool:
    """All of ``detector``'s filters on ``text``."""
    for char in detector.chars:
        if char not in text:
            return False
    if detector.needles:
        for needle in detector.needles:
            if needle in text:
                break
        else:
            return False
    if detector.hints:
        lowered = text.lower()
        for hint in detector.hints:
            if hint in lowered:
                break
        else:
            return False
    return detector.gate is None or detector.gate.search(text) is not None


def _run_from(
    detectors: Sequence[Detector],
    start: int,
    text: str,
    run: Run,
    counts: dict[SecretKind, int],
) -> str:
    """The detectors from ``start`` on, each whose filters pass on the current text (the
    path after a replacement, which is rare: one check per detector is enough)."""
    for index in range(start, len(detectors)):
        detector = detectors[index]
        if _passes(detector, text):
            changed = run(detector, text, counts)
            if changed is not None:
                text = changed
    return text
