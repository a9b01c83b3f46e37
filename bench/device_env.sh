# Source on the GPU machine: carried wheels into /tmp/site, planc importable from the checkout.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || return 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# The digest's read-and-hash loop is built when planc is installed; this checkout runs uninstalled:
# build it in place where it is missing or stale (else digest-verified loads hash in Python)
python3 -c "from planc.execute.io import readhash; import sys; sys.exit(readhash.stale_reason() is not None)" \
    || bash tools/build_native.sh >&2 || echo "device_env: the read-and-hash loop is not built here" >&2
# planc's bytecode compiled first, as an installed package has it (this machine writes none itself)
python3 -m compileall -q planc >/dev/null 2>&1 || true
