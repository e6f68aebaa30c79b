"""Thin click front ends; the work happens in the stage modules."""
