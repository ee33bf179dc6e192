# Only the C extension lives here; all other metadata is in pyproject.toml.
from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "cowfs._native",
            ["native/cowfs_native.c"],
            extra_compile_args=["-O3", "-Wall"],
            libraries=["z"],  # zlib's crc32, the one record headers carry (Debian: zlib1g-dev)
        )
    ],
)
