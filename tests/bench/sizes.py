"""The quick bench's dataset made smaller still for the tests that run it whole or in part:
every scenario still has files to work on and produces its figure."""

SMALL_DATASET = [
    *("--epoch-files", "20", "--tree-files", "100", "--small-files", "10"),
    *("--wide-files", "50", "--large", "8M", "--write", "2M", "--lazy-tensors", "4"),
]
