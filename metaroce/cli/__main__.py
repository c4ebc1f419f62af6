from . import _entry

_entry()
