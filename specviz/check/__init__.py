"""The drafter sanity check: its statistics and its text, HTML and JSON reports."""
