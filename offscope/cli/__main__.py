from offscope.cli import entry

entry()
