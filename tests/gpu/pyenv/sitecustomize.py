"""Started by tests/gpu/py.sh: python itself (torch, ssl, zlib, ffi ...) was started without the
packed tools' libraries (build-gpu/lib: this build machine's HDF5, OpenSSL, zlib, libffi ... that
could shadow the image's own); the tools this python starts get them back. The dynamic loader
read LD_LIBRARY_PATH when python started, so setting it here affects only the children."""
import os

_tools = os.environ.get("TIDAL_TOOL_LD_LIBRARY_PATH")
if _tools is not None:
    os.environ["LD_LIBRARY_PATH"] = _tools
