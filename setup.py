"""The one part of the build pyproject.toml cannot say: the stylesheets (`styles/`) and the example profiles
(`profiles/`) stay at the repository root, and the wheel carries them inside the package as
`console/shipped/` (console/sources/shipped.py finds them there). setuptools' `find` lists only the folders it
sees under console/, so the packages are found here and the two mapped ones added to them."""

from setuptools import find_packages, setup

SHIPPED = {"console.shipped.styles": "styles", "console.shipped.profiles": "profiles"}
DATA = ["console.data", "console.twin.data"]  # folders of JSON without an __init__.py

setup(packages=[*find_packages(include=["console", "console.*"]), *DATA, *SHIPPED], package_dir=SHIPPED)
