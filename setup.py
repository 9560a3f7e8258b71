"""Package discovery for the folder-to-import-name mapping the design card asks for.

The top-level folders are named for what they hold (capture/, analyze/, reports/), but install as
one import namespace: tokentrace.profiling, tokentrace.analysis, tokentrace.reports. setuptools'
`packages.find` cannot rename folders, so this walks each mapped folder and lists every
subfolder that has an `__init__.py`: a new subpackage can never be left out of the wheel
(tests/test_wheel.py builds one and checks). Everything else is declared in pyproject.toml.
"""

from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).resolve().parent
# import name -> folder; one source of truth, read by tests/test_wheel.py too.
PACKAGE_DIRS = {
    "tokentrace": "tokentrace",
    "tokentrace.profiling": "capture",
    "tokentrace.analysis": "analyze",
    "tokentrace.reports": "reports",
}


def packages() -> list[str]:
    found = []
    for name, folder in PACKAGE_DIRS.items():
        base = ROOT / folder
        for init in sorted(base.rglob("__init__.py")):
            rel = init.parent.relative_to(base)
            found.append(".".join((name, *rel.parts)))
    return found


setup(packages=packages(), package_dir=PACKAGE_DIRS)
