"""Package discovery for setuptools (all metadata lives in pyproject.toml).

Why a setup.py at all: the repository root *is* the ``mechsandbox`` package (``package-dir``
maps ``mechsandbox`` to ``.``, as OpenEnv environments do), and pyproject's ``packages.find``
cannot prefix what it finds with ``mechsandbox.``. Listing packages by hand in pyproject let a new
family package go missing from the wheel; here every package below the root is found, except the
folders that are not part of the installed library.
"""

from setuptools import find_packages, setup

NOT_INSTALLED = ("tests", "tests.*", "bench", "bench.*", "docs", "docs.*", "build", "build.*")

setup(packages=["mechsandbox", *(f"mechsandbox.{p}" for p in find_packages(".", exclude=NOT_INSTALLED))])
