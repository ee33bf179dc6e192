"""Under `make sanitize` the native module is the ASan/UBSan build in build/sanitize (a run
that loaded the ordinary build would check nothing); in the ordinary suite, it is skipped."""
import os

import pytest

import cowfs._native


@pytest.mark.skipif("libasan" not in os.environ.get("LD_PRELOAD", ""), reason="only under make sanitize")
def test_the_sanitized_build_is_the_one_loaded() -> None:
    assert "build/sanitize" in cowfs._native.__file__
