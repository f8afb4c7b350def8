"""``python -m explorer.spec``: the study file's page, every field from its docstring (``docs/study-file.md``)."""

from explorer.spec._reference import study_file_page

print(study_file_page(), end="")
