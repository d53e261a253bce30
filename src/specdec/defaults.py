"""Defaults shared by the API and the command line, in a module that imports nothing heavy."""

DEFAULT_MODEL = "gemma-3-270m"
DTYPE_NAMES = ("bfloat16", "float32")
