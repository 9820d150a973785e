"""Command line: `autocast-onnx` and its subcommands."""
