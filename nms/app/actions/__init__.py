"""Actuators: the code that carries out approved actions (issue #13)."""
