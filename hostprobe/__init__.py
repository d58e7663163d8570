"""Host probe agent (nms-agent): NIC-to-NIC probe mesh, kernel timestamps, clock sync, path discovery.

Lands with the host-agent issue; today only the entry point exists.
"""
