# Source on the GPU machine: carried wheels into /tmp/site, planc importable from the checkout.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || return 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# The digest's read-and-hash loop is built when planc is installed; this checkout runs uninstalled:
# build it in place where a compiler is (else digest-verified loads hash in Python; carry
# planc/execute/io/native to bring one built here)
[ -f planc/execute/io/native/readhash.x86_64-linux.so ] || bash tools/build_native.sh >/dev/null 2>&1 || \
    echo "device_env: the read-and-hash loop is not built here (no C compiler?)" >&2
