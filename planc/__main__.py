try:
    from planc.entry import main
except KeyboardInterrupt:  # Ctrl-C while the interpreter is still importing: one line, no traceback
    import sys

    sys.stderr.write("planc: interrupted\n")
    sys.exit(130)

main()
