"""One module per command: each has ``add_parser(sub)`` (registers its subcommand and sets
``func``) and the function that runs it; ``cli.py`` only dispatches."""
