"""The UFM Enterprise collector: see README.md here (sample configuration) and collector.py."""
