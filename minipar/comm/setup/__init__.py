"""The MPI set-up diagnosed: the library and the launcher found, a wrong pair named. See
../__init__.py."""
