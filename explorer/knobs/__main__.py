"""``python -m explorer.knobs``: the knobs as a Markdown page (``docs/knobs.md``)."""

from explorer.knobs._registry import reference

print(reference(), end="")
