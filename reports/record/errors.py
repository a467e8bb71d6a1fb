"""The one error of reading a record.

A record is read in steps (its JSON line decoded, its schema version upgraded, every field
checked against its type), and any step can find that the input is not a record this reader
accepts. Each raises `RecordError`, whose message says where the input came from (a file and
line, when read from a results file), which field is wrong, and why.
"""


class RecordError(ValueError):
    """A record that cannot be read; the message names where (file:line) and the field."""
