# Only the C extension lives here; all other metadata is in pyproject.toml.
import platform
from glob import glob

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

# BLAKE3's official C implementation, vendored unmodified in native/blake3/ (its README.md).
# On x86-64 the SSE2/SSE4.1/AVX2/AVX-512 kernels are upstream's Unix assembly (.S): they
# need no -m flags, and blake3_dispatch.c picks the widest one the CPU has at run time
# (cpuid), so the build works on any x86-64 and still uses AVX-512 where there is one.
# Elsewhere only the portable C is built (upstream's documented BLAKE3_NO_* / NEON defines).
# oneTBB stays off: upstream only compiles it in when BLAKE3_USE_TBB is defined.
BLAKE3 = "native/blake3/"
blake3_sources = [BLAKE3 + f for f in ("blake3.c", "blake3_dispatch.c", "blake3_portable.c")]
if platform.machine().lower() in ("x86_64", "amd64"):
    blake3_sources += [BLAKE3 + f"blake3_{isa}_x86-64_unix.S" for isa in ("sse2", "sse41", "avx2", "avx512")]
    blake3_macros = []
else:
    blake3_macros = [(m, None) for m in ("BLAKE3_NO_SSE2", "BLAKE3_NO_SSE41", "BLAKE3_NO_AVX2", "BLAKE3_NO_AVX512")]
    blake3_macros.append(("BLAKE3_USE_NEON", "0"))  # blake3_neon.c is not vendored


class BuildExt(build_ext):
    """build_ext that also compiles preprocessed assembly (.S) sources.

    distutils' Unix compiler refuses file types outside src_extensions; gcc and clang
    assemble .S (running the C preprocessor first) with the same command line as .c."""

    def build_extensions(self):
        self.compiler.src_extensions = [*self.compiler.src_extensions, ".S"]
        super().build_extensions()


setup(
    cmdclass={"build_ext": BuildExt},
    ext_modules=[
        Extension(
            "cowfs._native",
            ["native/cowfs_native.c", "native/blake3_batch.c", "native/dataplane.c", "native/cdc.c", "native/fanout.c", "native/osutil.c", "native/floatcodec.c", "native/fdelta_encode.c", "native/fdelta_decode.c",
             *blake3_sources],
            include_dirs=["native/blake3"],
            define_macros=blake3_macros,
            depends=sorted(glob("native/*.h") + glob(BLAKE3 + "*.h")) + ["native/cowfs_native.map"],
            extra_compile_args=["-O3", "-Wall"],  # upstream's C compiles clean with these too
            # export PyInit__native alone: the vendored blake3_* symbols stay inside the module
            extra_link_args=["-Wl,--version-script=native/cowfs_native.map"],
            libraries=["isal", "m"],  # libm: the float codec's log2; ISA-L's crc32_gzip_refl: zlib's CRC32, the one record headers carry (Debian: libisal-dev)
        )
    ],
)
