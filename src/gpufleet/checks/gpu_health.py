"""Placeholder until the group is written."""

CHECKS: list = []
