"""One module per command: each has ``add_parser(sub)`` (registers its sub-command, sets ``func``
to its ``run``) and ``run(args)``, which returns an exit code or the report it produced
(:class:`~torchrepro.commands._finish.Outcome`); ``cli.py`` registers them, dispatches, and
finishes reports in one place (:mod:`torchrepro.commands._finish`)."""
