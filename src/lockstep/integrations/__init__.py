"""Adapters that make popular training frameworks speak lockstep's black-box protocol."""
