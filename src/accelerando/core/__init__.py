"""The foundation every other layer stands on: settings, devices, cluster environments, the process
group, the Runtime and the small shared vocabularies (enums, version, safe file handling).

Imports nothing of accelerando outside itself.

Subpackages and modules are imported by their full path; this package imports nothing.
"""
