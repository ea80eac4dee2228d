"""The pre-filter: which detector could match next, decided by cheap substring searches.

Every :class:`~memtier.redaction.detectors.Detector` declares pre-filters (``chars``,
``needles``, ``hints``, ``gate``), each a NECESSARY condition for a match: a detector whose
filter fails cannot match, so skipping it changes nothing (``tests/test_redaction_prefilter.py``
checks every match against its filters, and that redaction without them is the same).
Empty filters mean "always run".

Why: the patterns start with one literal character followed by a lookbehind, so the regex
engine stops at every occurrence of that (often common) character; a substring search for a
longer literal is 3-10x cheaper than running the pattern, and most chat text passes none.

The filters are checked on the *current* text before every run, so a replacement made by an
earlier detector is seen.  The checks are plain loops (a generator per detector per call
costs more than the substring searches themselves), and :func:`next_candidate` scans ahead
to the next detector worth running in one call, so the cost of a call is paid once per
detector that runs, not once per detector.
"""

from __future__ import annotations

from collections.abc import Sequence

from memtier.redaction.detectors import Detector

__all__ = ["next_candidate"]


def next_candidate(
    detectors: Sequence[Detector], start: int, text: str, lowered: str | None
) -> tuple[int, str | None]:
    """The index of the first detector at or after ``start`` whose filters pass on ``text``.

    ``len(detectors)`` when none does.  ``lowered`` is ``text.lower()`` if the caller has it
    (else None); it is computed here when a detector with hints first needs it, and returned
    so the caller can reuse it until the text changes.
    """
    for index in range(start, len(detectors)):
        detector = detectors[index]
        if detector.chars:
            missing = False
            for char in detector.chars:
                if char not in text:
                    missing = True
                    break
            if missing:
                continue
        if detector.needles:
            for needle in detector.needles:
                if needle in text:
                    break
            else:
                continue
        if detector.hints:
            if lowered is None:
                lowered = text.lower()
            for hint in detector.hints:
                if hint in lowered:
                    break
            else:
                continue
        if detector.gate is not None and detector.gate.search(text) is None:
            continue
        return index, lowered
    return len(detectors), lowered
