"""One exception tree for jaxcache. Messages say what the user can do about the problem."""

from __future__ import annotations


class JaxcacheError(Exception):
    """Root of every error jaxcache raises on purpose."""


class InvalidInputError(JaxcacheError, ValueError):
    """Input from a user (a URL, a name, a size, a duration) is malformed."""


class TooLargeError(InvalidInputError):
    """An object is larger than what readers of its kind accept (a run record's 32 MiB): it is not one of ours."""


class InvalidRootError(InvalidInputError):
    """A cache root URL cannot be opened: unknown scheme, missing directory, bad bucket name."""


class PathEscapeError(InvalidInputError):
    """An object name would leave its cache root (`..`, an absolute path, a NUL byte)."""


class StorageError(JaxcacheError):
    """The storage backend failed; the message names the root and the operation."""


class StoragePermissionError(StorageError):
    """The credentials in use may not perform the operation."""


class RootGoneError(StorageError):
    """A local cache root does not exist or is not a directory: listed, it would look like an empty cache."""


class NotRegularFileError(StorageError):
    """An object under a local root is a FIFO, socket, device, symbolic link or directory: it is not read (a FIFO
    would block the reader, a link could lead it out of the root), and a reader skips it and goes on."""


class EncodedObjectError(NotRegularFileError):
    """An object stored with a Content-Encoding (``gzip``): neither JAX nor jaxcache writes one, and a store's library
    would hand back its bytes decoded, however large they grow. It is never read past its answer's headers; a reader
    skips it as it skips a FIFO, and it is named (``storage.skipped``) as not an entry or record jaxcache wrote."""


class UnreachableError(StorageError):
    """A store did not answer within a deadline (stopped, unreachable, or too slow): the caller goes on without it."""


class PreconditionFailedError(StorageError):
    """The object changed since it was listed (another version), or already exists on a create-only write."""


class MissingDependencyError(JaxcacheError):
    """An optional library is needed for this operation (for example google-cloud-storage for gs:// roots)."""
