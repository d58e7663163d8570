"""The SNMP collector: see README.md here (sample configuration) and collector.py."""
