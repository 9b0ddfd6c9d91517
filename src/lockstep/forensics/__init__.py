"""Forensics of a hung or crashed distributed run, from torch's flight recorder.
Design: docs/design/forensics.md.
"""
