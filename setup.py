"""Build hook for the optional C extension ``engramdb._native`` (metadata is in pyproject.toml).

The extension speeds up the bulk-write path's crypto calls (engramdb/_native.c, over
OpenSSL's libcrypto). It is optional: without a C compiler or OpenSSL's headers the build
skips it and engramdb runs its pure-Python path, which writes the same bytes.
"""
from setuptools import Extension, setup

# -ffp-contract=off: no fused multiply-add, so pair_values rounds after every operation as
# numpy does (the C and Python paths must give the same bits).
setup(ext_modules=[Extension("engramdb._native", ["engramdb/_native.c"], libraries=["crypto"],
                             extra_compile_args=["-ffp-contract=off"], optional=True)])
