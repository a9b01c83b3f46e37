try:
    from planc.face.entry import main
except KeyboardInterrupt:  # Ctrl-C while the interpreter is still importing: one line, no traceback
    import os
    import signal
    import sys

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not interrupt the exit
    try:
        sys.stderr.write("planc: interrupted\n")
        sys.stderr.flush()
    except (AttributeError, OSError, ValueError):  # stderr closed
        pass
    os._exit(130)

main()
