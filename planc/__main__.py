from planc.cli import entry

entry()
