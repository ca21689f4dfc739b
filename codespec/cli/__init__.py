"""The `codespec` command line; each command is a module with `register` and a handler."""
