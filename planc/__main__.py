try:
    from planc.cli import entry
except KeyboardInterrupt:  # Ctrl-C while the interpreter is still importing: one line, no traceback
    import sys

    sys.stderr.write("planc: interrupted\n")
    sys.exit(130)

entry()
