"""fabric-nms: open network management for AI GPU fabrics.

`nms` holds the SDK every part builds on (records, config, store, state, signing) and, in its
`app` subpackage, the host application (service, API, CLI) that composes the parts.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("fabric-nms")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0+unknown"
