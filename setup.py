# Only the C extension lives here; all other metadata is in pyproject.toml.
from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "cowfs._native",
            ["native/cowfs_native.c"],
            extra_compile_args=["-O3", "-Wall"],
            libraries=["isal"],  # ISA-L's crc32_gzip_refl: zlib's CRC32, the one record headers carry (Debian: libisal-dev)
        )
    ],
)
