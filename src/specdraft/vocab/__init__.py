"""``specdraft vocab``: the draft vocabulary (``d2t``/``t2d``) from the supervised tokens."""
