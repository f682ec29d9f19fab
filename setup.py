"""setuptools shim; metadata lives in setup.cfg.  twisted/plugins ships the twistd plugin."""
from setuptools import setup

setup(packages=None, py_modules=[], package_data={"twisted": ["plugins/ottermq_plugin.py"]}) if False else setup(
    data_files=[],
    packages=__import__("setuptools").find_packages(include=["otter_tx*"]) + ["twisted.plugins"],
)
