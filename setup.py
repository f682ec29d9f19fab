"""setuptools shim: metadata is in setup.cfg; this adds the twistd plugin module."""
from setuptools import find_packages, setup

setup(packages=find_packages(include=["otter_tx", "otter_tx.*"]) + ["twisted.plugins"])
