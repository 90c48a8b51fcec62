"""Adapters from other libraries to flamia's attention; each module imports its library."""
