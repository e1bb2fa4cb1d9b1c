"""This machine as the library sees it: files, who owns and may write them, what is installed."""
