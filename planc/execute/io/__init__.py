"""The bytes from the checkpoint files: the reader (`reader`: `preadv`, O_DIRECT, mapped windows),
the pinned ring and its threads (`ring`), the digest-verified reader (`digestread`) and its
read-and-hash loop in machine code (`readhash`, `native/`). Below it: `device`."""
