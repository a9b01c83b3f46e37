"""The `verify=` and `digest=` arguments of `planc.load`, `load_into` and `LoadedModel.reload`,
checked where they come in: `verify` False (no check), True (the bytes compared with the
checkpoint after the load) or "digest" (every byte read hashed as it streams and compared with a
digest file: `digest`, or the one `planc digest` writes beside the checkpoint when None)."""

from __future__ import annotations

from .codes import Code
from .errors import SpecError


def verify_arg(verify, digest) -> tuple[bool, object]:
    """-> (compare after the load, the digest file: a path, True for the default one, or None)."""
    if isinstance(verify, str) and verify == "digest":
        return False, True if digest is None else digest
    if not isinstance(verify, bool):  # 1, 0 and 1.0 equal True and False, but are not what was meant
        raise SpecError(f"verify must be False, True or 'digest', got {str(verify)[:40]!r}", code=Code.BAD_VERIFY)
    if digest is not None:  # a digest file with verify=False or True: which check was meant is not known
        raise SpecError(f"digest={str(digest)[:80]!r} is given with verify={verify}: pass verify='digest' to hash the "
                        f"bytes against it as they stream (or leave digest out)", code=Code.BAD_VERIFY)
    return verify, None
