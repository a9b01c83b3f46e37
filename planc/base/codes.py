"""The closed set of error codes: every `PlancError` carries one of these, and no other.

Input: nothing. Output: `Code`, a `StrEnum` whose members compare equal to their text ("spec-syntax"),
each with the exit code of the error class that raises it (`exit_code`) and a one-line meaning
(`meaning`); `table()` renders them as the Markdown table in docs/reliability.md (a test holds the two
equal). Invariants: a code's text is short, lower-case kebab and stable (scripts match on it);
`PlancError` refuses a code not listed here at construction, so a new code is added here first.
Codes are grouped by the stage that raises them; one member per line (a tool adds lines before the
end marker).
"""

from __future__ import annotations

from enum import StrEnum


class Code(StrEnum):
    """An error code: `Code.SPEC_SYNTAX == "spec-syntax"`; `.exit_code` and `.meaning` describe it."""

    exit_code: int
    meaning: str

    def __new__(cls, value: str, exit_code: int = 1, meaning: str = ""):
        obj = str.__new__(cls, value)
        obj._value_ = value
        obj.exit_code = exit_code
        obj.meaning = meaning
        return obj

    # the error classes' defaults (planc/base/errors.py)
    ERROR = "error", 1, "a failure with no more specific code"
    MANIFEST = "manifest", 2, "a checkpoint file or index is malformed, missing or inconsistent"
    SPEC = "spec", 2, "a placement spec is malformed or names something that does not exist"
    BIND = "bind", 2, "the spec's rules and the checkpoint do not fit together"
    PLAN = "plan", 2, "a plan file cannot be read"
    FINGERPRINT = "fingerprint", 2, "a checkpoint file changed between compile and run"
    REFUSED = "refused", 3, "the plan, or one of its runs, does not fit the budget or the live room"
    EXECUTE = "execute", 1, "the load failed while running"
    READ = "read", 2, "a read from a checkpoint file failed or came back short during the load"
    INTERRUPTED = "interrupted", 130, "the load was interrupted (SIGINT); everything it allocated was released"
    HANDOFF = "handoff", 2, "loaded tensors and a PyTorch module do not fit together"
    OUTPUT = "output", 2, "an output path planc must not or cannot write"
    USAGE = "usage", 2, "a command line that planc cannot act on (arguments, launcher variables)"
    # checkpoint files: paths and files
    MISSING = "missing", 2, "a checkpoint file or folder does not exist (or is a broken symlink)"
    NOT_A_FILE = "not-a-file", 2, "a checkpoint path is not a regular file"
    BAD_PATH = "bad-path", 2, "a path cannot be used at all (NUL byte, unpaired surrogate)"
    SYMLINK_LOOP = "symlink-loop", 2, "a checkpoint path is a symlink loop"
    UNREADABLE = "unreadable", 2, "a checkpoint file exists but cannot be read"
    EMPTY = "empty", 2, "a checkpoint file is empty (0 bytes)"
    SHORT_FILE = "short-file", 2, "a safetensors file is shorter than its 8-byte header length"
    SHORT_READ = "short-read", 2, "a file gave fewer bytes than its size said while its header was read"
    NO_SHARDS = "no-shards", 2, "a checkpoint folder holds no safetensors files"
    # safetensors headers
    HEADER_TOO_LARGE = "header-too-large", 2, "a safetensors header length exceeds the cap"
    HEADER_PAST_EOF = "header-past-eof", 2, "a safetensors header length runs past the end of the file"
    HEADER_NOT_UTF8 = "header-not-utf8", 2, "a safetensors header is not UTF-8 text (or names a lone surrogate)"
    HEADER_NOT_JSON = "header-not-json", 2, "a safetensors header is not JSON"
    HEADER_NOT_OBJECT = "header-not-object", 2, "a safetensors header is JSON but not an object"
    HEADER_DUPLICATE_KEY = "header-duplicate-key", 2, "a safetensors header holds one key twice in one object"
    BAD_METADATA = "bad-metadata", 2, "a safetensors header's __metadata__ is not an object of strings"
    BAD_ENTRY = "bad-entry", 2, "a tensor's header entry is not an object with dtype, shape and data_offsets"
    BAD_SHAPE = "bad-shape", 2, "a tensor's shape is not a list of non-negative integers"
    BAD_OFFSETS = "bad-offsets", 2, "a tensor's data_offsets are not [begin, end] with non-negative integers"
    SIZE_MISMATCH = "size-mismatch", 2, "a tensor's shape and dtype do not give the bytes its offsets span"
    PARTIAL_BYTE = "partial-byte", 2, "a sub-byte tensor does not fill a whole number of bytes"
    DUPLICATE_TENSOR = "duplicate-tensor", 2, "one tensor name appears twice in a file"
    OVERLAP = "overlap", 2, "two tensors' bytes overlap in a file"
    HOLE = "hole", 2, "a file leaves unclaimed bytes between two tensors"
    TRAILING_BYTES = "trailing-bytes", 2, "a file holds bytes after its last tensor"
    DATA_SHORT = "data-short", 2, "a tensor's bytes end past the end of the file"
    # sharded checkpoints: the index
    INDEX_AMBIGUOUS = "index-ambiguous", 2, "a folder holds more than one index file"
    INDEX_BAD = "index-bad", 2, "an index file is not the JSON object of a weight map"
    INDEX_DUPLICATE = "index-duplicate", 2, "an index holds one key twice in one object"
    INDEX_MISSING_SHARD = "index-missing-shard", 2, "an index names a shard that does not exist"
    INDEX_TENSOR_MISSING = "index-tensor-missing", 2, "an index names a tensor its shard does not hold"
    INDEX_MISMATCH = "index-mismatch", 2, "a shard holds a tensor the index puts elsewhere or not at all"
    PATH_ESCAPE = "path-escape", 2, "an index names a shard outside its folder (absolute or ..)"
    # GGUF files
    GGUF_BAD_MAGIC = "gguf-bad-magic", 2, "a file is not GGUF (wrong magic)"
    GGUF_BAD_VERSION = "gguf-bad-version", 2, "a GGUF version planc does not read"
    GGUF_TRUNCATED = "gguf-truncated", 2, "a GGUF file ends inside its header"
    GGUF_COUNT_PAST_EOF = "gguf-count-past-eof", 2, "a GGUF count of entries cannot fit the bytes left"
    GGUF_SIZE_PAST_EOF = "gguf-size-past-eof", 2, "a GGUF tensor needs more bytes than the file holds"
    GGUF_BAD_STRING = "gguf-bad-string", 2, "a GGUF string is over the length cap or not UTF-8"
    GGUF_BAD_VALUE = "gguf-bad-value", 2, "a GGUF metadata value has an unknown or unsupported type"
    GGUF_BAD_SHAPE = "gguf-bad-shape", 2, "a GGUF tensor has no dims, too many, or a zero or negative dim"
    GGUF_BAD_ALIGNMENT = "gguf-bad-alignment", 2, "a GGUF general.alignment is not a power of two"
    GGUF_DUPLICATE_KEY = "gguf-duplicate-key", 2, "a GGUF metadata key or tensor name appears twice"
    GGUF_SPLIT = "gguf-split", 2, "a split GGUF checkpoint's files do not form one whole"
    UNKNOWN_DTYPE = "unknown-dtype", 2, "a tensor's dtype (or GGML type) is not one planc knows"
    # specs
    SPEC_MISSING = "spec-missing", 2, "a spec file does not exist"
    SPEC_UNREADABLE = "spec-unreadable", 2, "a spec file cannot be read (a folder, no permission, not text)"
    SPEC_TOO_LARGE = "spec-too-large", 2, "a spec is over the size cap or builds too much (aliases, depth)"
    SPEC_SYNTAX = "spec-syntax", 2, "a spec is not valid YAML or JSON"
    SPEC_DUPLICATE_KEY = "spec-duplicate-key", 2, "a spec holds one key twice in one mapping"
    SPEC_NOT_MAPPING = "spec-not-mapping", 2, "a spec is not a mapping of keys"
    SPEC_INVALID = "spec-invalid", 2, "a spec field has a wrong type or value (the message names the field)"
    BAD_DEVICE = "bad-device", 2, "a spec's device is not one planc can place on"
    BAD_ENV = "bad-env", 2, "an environment variable a spec reads holds a bad value"
    # binding rules to tensors
    UNMATCHED = "unmatched", 2, "tensors of the checkpoint match no rule"
    NAME_CLASH = "name-clash", 2, "two rules produce one tensor name"
    BAD_CONVERT = "bad-convert", 2, "a rule converts a tensor of a dtype that does not convert"
    BAD_DEQUANTIZE = "bad-dequantize", 2, "a rule dequantizes a tensor of a dtype its format does not take"
    BAD_TRANSPOSE = "bad-transpose", 2, "a rule transposes a tensor that is not 2-D"
    SCALE_MISSING = "scale-missing", 2, "a dequantized tensor's scale tensor is not in the checkpoint"
    SCALE_SHAPE = "scale-shape", 2, "a scale tensor's dtype or shape does not fit its weight"
    FP4_DEVICE = "fp4-device", 2, "an FP4 dequantization placed on the device (it runs on the host)"
    FUSE_DIM = "fuse-dim", 2, "a fuse along a dim its parts do not have"
    FUSE_INCOMPLETE = "fuse-incomplete", 2, "a fuse group misses some of its parts"
    FUSE_INTERLEAVED = "fuse-interleaved", 2, "a fuse whose parts' rows would interleave"
    GROUP_DUPLICATE = "group-duplicate", 2, "two tensors land in one slot of a fuse or stack group"
    GROUP_MISMATCH = "group-mismatch", 2, "a fuse or stack group's parts differ in dtype or shape"
    STACK_INCOMPLETE = "stack-incomplete", 2, "a stack group misses parts or has unexpected ones"
    SPLIT_DIM = "split-dim", 2, "a tensor-parallel split on a dim the tensor does not have"
    SPLIT_UNEVEN = "split-uneven", 2, "a split dim not divisible by tensor_parallel.size"
    SPLIT_SUBBYTE = "split-subbyte", 2, "a split of a tensor with sub-byte elements"
    SPLIT_FUSE = "split-fuse", 2, "a split of a fuse along a dim other than 0"
    SPLIT_PAD = "split-pad", 2, "a padded split of a fused or stacked group"
    SPLIT_BLOCKS = "split-blocks", 2, "a split of an FP8 weight that cuts its scale blocks"
    SPLIT_FP4 = "split-fp4", 2, "a tensor-parallel split of an FP4 dequantization"
    BAD_RANK = "bad-rank", 2, "a rank that is not an integer in [0, tensor_parallel.size)"
    # plans
    PLAN_MISSING = "plan-missing", 2, "a plan file does not exist"
    PLAN_UNREADABLE = "plan-unreadable", 2, "a plan file cannot be read (a folder, no permission)"
    PLAN_TOO_LARGE = "plan-too-large", 2, "a plan file is over the size cap"
    PLAN_SYNTAX = "plan-syntax", 2, "a plan file is not JSON (or holds one key twice)"
    PLAN_KIND = "plan-kind", 2, "a JSON document or value that is not a planc plan"
    PLAN_VERSION = "plan-version", 2, "a plan of a format this planc does not read"
    PLAN_INVALID = "plan-invalid", 2, "a plan field fails its check (the message names the field)"
    PLAN_HEADER_MISMATCH = "plan-header-mismatch", 2, "a plan names a tensor or bytes its checkpoint's header does not hold"
    FILE_CHANGED = "file-changed", 2, "a checkpoint file's size or mtime changed since the plan was compiled"
    FILE_REMOVED = "file-removed", 2, "a checkpoint file was removed since the plan was compiled"
    FILE_UNREADABLE = "file-unreadable", 2, "a checkpoint file cannot be read since the plan was compiled"
    # admission
    HOST_BUDGET = "host-budget", 3, "a run needs more host memory than budget.host"
    DEVICE_BUDGET = "device-budget", 3, "a run needs more device memory than budget.device"
    NODE_BUDGET = "node-budget", 3, "the ranks sharing a host need more than budget.node_host"
    LIVE_ROOM = "live-room", 3, "a run needs more host memory than the machine has free now"
    DEVICE_ROOM = "device-room", 3, "the plan needs more device memory than the device has free now"
    # the load
    NO_DEVICE = "no-device", 1, "the plan's CUDA device does not exist on this machine"
    CUDA = "cuda", 1, "a CUDA driver function returned an error"
    HOST_MEMORY = "host-memory", 1, "host memory for the pinned ring could not be made"
    PIN_REFUSED = "pin-refused", 1, "the driver refused to pin host memory"
    RING_STUCK = "ring-stuck", 1, "the ring has no slot to give and nothing in flight"
    LOAD_FAILED = "load-failed", 1, "an unexpected failure during the load; everything allocated was released"
    VERIFY_MISMATCH = "verify-mismatch", 1, "--verify found loaded bytes that differ from the reference"
    READ_OPEN = "read-open", 2, "a checkpoint file cannot be opened for reading during the load"
    READ_FAILED = "read-failed", 2, "a read of a checkpoint file failed during the load"
    READ_SHORT = "read-short", 2, "a checkpoint file ended before a planned read during the load"
    DIRECT_REFUSED = "direct-refused", 2, "the file system refuses O_DIRECT and io.direct is on"
    # the torch hand-off
    TORCH_MISSING = "torch-missing", 2, "PyTorch is needed and not installed"
    NOT_A_MODULE = "not-a-module", 2, "load_into was given something that is not a torch.nn.Module"
    KEYS_MISMATCH = "keys-mismatch", 2, "the loaded tensors' names and the module's keys differ"
    SHAPE_MISMATCH = "shape-mismatch", 2, "loaded tensors differ in shape from the module's"
    DTYPE_UNSUPPORTED = "dtype-unsupported", 2, "a loaded dtype has no torch dtype in the installed torch"
    BUFFERS_UNINITIALIZED = "buffers-uninitialized", 2, "non-persistent buffers left on the meta device after the hand-off"
    # outputs
    OUTPUT_PATH = "output-path", 2, "an output's folder does not exist"
    OUTPUT_UNWRITABLE = "output-unwritable", 2, "an output's folder or file cannot be written"
    OUTPUT_NOT_FILE = "output-not-file", 2, "an output path is a folder, device, FIFO or socket"
    OUTPUT_IS_INPUT = "output-is-input", 2, "an output path is an input of the same command"
    OUTPUT_NOT_OURS = "output-not-ours", 2, "an output path holds a file planc did not write"
    BAD_VERIFY = "bad-verify", 2, "verify= is not False, True or \"digest\""
    BAD_RING = "bad-ring", 2, "warm_up's ring= is not True or False"
    DIGEST = "digest", 2, "a digest file cannot be used, or the bytes a load read do not match it"
    DIGEST_ABORTED = "digest-aborted", 2, "the load failed elsewhere while a read waited to be hashed"
    DIGEST_EDITED = "digest-edited", 2, "a digest file's own check does not match its contents (edited or damaged)"
    DIGEST_EXTENT = "digest-extent", 2, "a digest extent size that is not a power of two from 64 KiB to 1 GiB"
    DIGEST_INCOMPLETE = "digest-incomplete", 2, "bytes a digest check should have hashed were never hashed"
    DIGEST_MISMATCH = "digest-mismatch", 2, "bytes a load read do not match the digest file"
    DIGEST_MISSING = "digest-missing", 2, "a digest file does not exist or cannot be opened"
    DIGEST_OTHER = "digest-other", 2, "a digest file is the digest of another checkpoint (or the file changed)"
    DIGEST_READ = "digest-read", 2, "a checkpoint file ended early while it was hashed"
    DIGEST_TOO_LARGE = "digest-too-large", 2, "a digest file is larger than a digest file holds"
    DIGEST_VERSION = "digest-version", 2, "a digest file of an older format (write it again with planc digest)"
    DTYPE_MISMATCH = "dtype-mismatch", 2, "load_into(inplace=True): the plan writes another dtype than the module's tensor holds"
    INPLACE_UNSUPPORTED = "inplace-unsupported", 2, "load_into(inplace=True) of a plan that does not only copy into the module's tensors"
    NOT_CONTIGUOUS = "not-contiguous", 2, "load_into(inplace=True): a module's tensor is not contiguous"
    NOT_ON_DEVICE = "not-on-device", 2, "load_into(inplace=True): a module's tensor is not on the load's device"
    RELOAD_FREED = "reload-freed", 2, "a reload into a model that was freed"
    RELOAD_LAYOUT = "reload-layout", 2, "a reload target does not match the live model's layout; nothing was written"
    TORN = "torn", 1, "a reload failed after it began writing; the model is refused until a reload succeeds"
    MODEL_FREED = "model-freed", 1, "a tensor of a model read after the model's free()"
    DIGEST_FORMAT = "digest-format", 2, "a digest file is malformed"
    SPLIT_GGUF_BLOCK = "split-gguf-block", 2, "a tensor-parallel split that would cut a block of a block-quantized GGUF tensor"
    BAD_OP_DTYPE = "bad-op-dtype", 2, "an op asked of a part cannot produce its dtype from its source dtype (compile or a plan file)"
    OUTPUT_FAILED = "output-failed", 2, "stdout could not take the output (closed, or a full device)"
    PIPE_CLOSED = "pipe-closed", 141, "the reader of stdout went away; nothing more is printed"
    SHAPE_LIMIT = "shape-limit", 2, "a loaded tensor would pass the limits a plan can hold (more than 16 dims, a dim over 2**62)"
    GGUF_DEQUANTIZE = "gguf-dequantize", 2, "a rule's dtype asks to dequantize a GGUF block type planc does not dequantize (load it with keep)"
    GGUF_GROUP = "gguf-group", 2, "a fuse or stack of block-quantized GGUF tensors"
    BAD_UNPERMUTE = "bad-unpermute", 2, "a rule unpermutes a tensor that is not a GGUF Llama attn_q / attn_k weight, or with a transpose, dequantize or group"
    SPLIT_UNPERMUTE = "split-unpermute", 2, "a tensor-parallel split of unpermuted GGUF q/k rows that is not a row split on head boundaries"
    BAD_ADD = "bad-add", 2, "a rule adds a constant to a tensor that is not stored as F32, F16 or BF16 (GGUF blocks, integers)"
    # end of codes (new members go above this line)


def table() -> str:
    """The Markdown table of every code (docs/reliability.md holds it between its markers)."""
    rows = ["| code | exit | meaning |", "|---|---|---|"]
    rows += [f"| `{c.value}` | {c.exit_code} | {c.meaning} |" for c in Code]
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(table(), end="")
