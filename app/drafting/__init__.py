"""Drafter kinds, each declared once (`kinds.KINDS`): what it needs (a draft model, the target's own
head, nothing), its memory rows for the planner, how its drafter is opened beside the target and
timed, and the check that says why a target (and draft) cannot draft so. A new kind (EAGLE-3,
DFlash) is one module here plus its tests."""
