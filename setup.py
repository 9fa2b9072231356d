"""Build hook for the optional C extension ``engramdb._native`` (metadata is in pyproject.toml).

The extension speeds up the bulk-write path's crypto calls (engramdb/_native.c, over
OpenSSL's libcrypto). It is optional: without a C compiler or OpenSSL's headers the build
skips it and engramdb runs its pure-Python path, which writes the same bytes.
"""
from setuptools import Extension, setup

setup(ext_modules=[Extension("engramdb._native", ["engramdb/_native.c"], libraries=["crypto"], optional=True)])
