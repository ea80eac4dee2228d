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
earlier detector is seen.  The checks are plain loops (a generator per detector per call
costs more than the substring searches themselves), inside one loop over the detectors:
the engine's work for a detector that passes is a callback, so a detector that is skipped
costs its filter checks and nothing else.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from memtier.redaction.detectors import Detector
from memtier.redaction.placeholders import SecretKind

__all__ = ["run_filtered"]


def run_filtered(
    detectors: Sequence[Detector],
    text: str,
    run: Callable[[Detector, str, dict[SecretKind, int]], str | None],
    counts: dict[SecretKind, int],
) -> str:
    """Call ``run(detector, text, counts)`` for each detector, in order, whose filters pass on
    the current text; returns the text after the last one.

    ``run`` returns the new text if the detector replaced something, else None: the filters
    of the detectors after it are checked on the text as it is then.  (``counts`` is passed
    through so that ``run`` needs no closure built per call.)
    """
    lowered: str | None = None  # text.lower(), computed when a detector with hints needs it
    for detector in detectors:
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
        changed = run(detector, text, counts)
        if changed is not None:
            text = changed
            lowered = None
    return text
