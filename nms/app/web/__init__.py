"""The live fabric view's page, ES modules and stylesheet (package data; served by nms/app/api/ui.py)."""
