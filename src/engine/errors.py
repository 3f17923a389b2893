"""The one exception type for bad input and unusable files.

Entry points turn it into a single-line message and a non-zero exit, never a traceback.
"""


class SpecsweepError(Exception):
    """A problem the user can fix (bad config value, missing corpus, corrupt file)."""
