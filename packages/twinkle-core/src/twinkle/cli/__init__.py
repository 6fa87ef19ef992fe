"""twinkle's command line: the ``twinkle`` console script (``twinkle.cli.main``)."""
