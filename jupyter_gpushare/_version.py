"""The package's version, in a module of its own: a subpackage that reports it (the server
extension) imports this, not the package root, whose hooks import that subpackage."""

__version__ = "0.1.0"
